//! Reading and writing [`Message`] frames on a tokio byte stream: the local connector's Unix socket, and an
//! overlay link's byte stream (`vigil::broker::transport`; on TCP that stream travels inside the link's Noise
//! records).
//!
//! The codec itself is pure and lives in `vigil_proto::message`; this is the only I/O around it. The checks are
//! made in the decoder's order: the length is bounded and the magic and version are checked before a large
//! length from an unknown peer is trusted to size a buffer.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use vigil_proto::message::{DecodeError, FrameError, Message, HEADER_LEN, MAGIC, MAX_FRAME, WIRE_VERSION};

/// Read one frame from `r`. `Ok(None)` on a clean end of stream before any byte of a frame.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Message>, FrameError> {
    let mut lenb = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut lenb[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(DecodeError::Truncated(got).into());
        }
        got += n;
    }
    let len = u32::from_be_bytes(lenb);
    if len > MAX_FRAME {
        return Err(DecodeError::TooLarge(len).into());
    }
    if (len as usize) < HEADER_LEN {
        return Err(DecodeError::Truncated(len as usize).into());
    }
    // Check the header before trusting a large length from an unknown peer.
    let mut head = [0u8; 4];
    r.read_exact(&mut head).await?;
    if head[..2] != MAGIC {
        return Err(DecodeError::BadMagic([head[0], head[1]]).into());
    }
    if head[2] != WIRE_VERSION {
        return Err(DecodeError::Version(head[2]).into());
    }
    let mut body = vec![0u8; len as usize];
    body[..4].copy_from_slice(&head);
    r.read_exact(&mut body[4..]).await?;
    Ok(Some(Message::decode_body_owned(body)?))
}

/// Write one frame to `w` (not flushed beyond the writer's own buffering).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, msg: &Message) -> std::io::Result<()> {
    w.write_all(&msg.encode()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stream_rejects_garbage_and_huge_lengths() {
        let mut g: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        assert!(read_frame(&mut g).await.is_err());
        let mut huge: &[u8] = &[0xff, 0xff, 0xff, 0xff, b'V', b'G', 1, 1];
        assert!(matches!(read_frame(&mut huge).await, Err(FrameError::Decode(DecodeError::TooLarge(_)))));
        let mut empty: &[u8] = b"";
        assert!(read_frame(&mut empty).await.unwrap().is_none());
    }
}
