//! The overlay key as a value: the 32-byte secret every broker of an instance holds, which authenticates and
//! encrypts its overlay links (docs/wire-format.md, "Link security"). It travels as 64 hexadecimal digits (a PMI
//! KVS, a key file). Making a key and reading or writing key files is the runtime's (`vigil::keyfile`).

/// Length of an overlay key in bytes (a Noise pre-shared key: 32 bytes).
pub const KEY_LEN: usize = 32;

/// An overlay key. Never printed: `Debug` shows only that it is a key.
#[derive(Clone, PartialEq, Eq)]
pub struct OverlayKey([u8; KEY_LEN]);

impl std::fmt::Debug for OverlayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OverlayKey(..)")
    }
}

impl Drop for OverlayKey {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference into our own array; a volatile write keeps the
            // compiler from eliding the clearing of memory it considers dead.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl OverlayKey {
    /// A key of these bytes (the runtime makes them from `/dev/urandom`).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> OverlayKey {
        OverlayKey(bytes)
    }

    /// The raw bytes (for the Noise handshake).
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The key as 64 lowercase hexadecimal digits (how it travels in a PMI KVS or a key file).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parse 64 hexadecimal digits. The error says what is wrong without echoing the text.
    pub fn from_hex(s: &str) -> Result<OverlayKey, String> {
        let s = s.trim();
        if s.len() != 2 * KEY_LEN {
            return Err(format!("an overlay key is {} hexadecimal digits, this one has {}", 2 * KEY_LEN, s.len()));
        }
        if !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err("an overlay key has only hexadecimal digits".into());
        }
        let mut k = [0u8; KEY_LEN];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        if k.iter().all(|b| *b == 0) {
            return Err("an overlay key of all zeros is a placeholder, not a key".into());
        }
        Ok(OverlayKey(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_bad_keys_are_refused_without_echo() {
        let k = OverlayKey::from_bytes([0xab; KEY_LEN]);
        assert_eq!(OverlayKey::from_hex(&k.to_hex()).unwrap(), k);
        assert_eq!(format!("{k:?}"), "OverlayKey(..)");
        assert!(OverlayKey::from_hex(&"00".repeat(KEY_LEN)).unwrap_err().contains("placeholder"));
        let e = OverlayKey::from_hex(&"zz".repeat(KEY_LEN)).unwrap_err();
        assert!(e.contains("hexadecimal") && !e.contains("zz"), "{e}");
        assert!(OverlayKey::from_hex("abc").unwrap_err().contains("64"));
    }
}
