//! Settings of a verbs RC connection (`vigil-rdma`) and their validation: plain data, parsed from the broker's
//! `tbon.rdma_*` attributes.

/// Settings of one RC connection. Both peers may use different values; the wire protocol takes the smaller
/// fragment size of the two, and each side's credits come from the other side's `depth`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// QP local ACK timeout exponent (`ibv_qp_attr.timeout`, 1..=31): the transport waits
    /// 4.096 µs × 2^timeout for an acknowledgement before retrying. Default 12 (≈16.8 µs × 1024 ≈ 16.8 ms).
    /// 0 is rejected: on soft-RoCE it disables the retransmission timer, so a dead peer is never reported.
    pub timeout: u8,
    /// QP transport retry count (`ibv_qp_attr.retry_cnt`, 1..=6): retries after a timeout before the send
    /// fails with `IBV_WC_RETRY_EXC_ERR`. Default 1: detection after about (1+1) × 16.8 ms ≈ 40 ms on rxe.
    /// 7 is rejected (soft-RoCE retries forever), and so is 0 (false errors on a healthy emulated link).
    pub retry_cnt: u8,
    /// Receiver-not-ready retry count (`ibv_qp_attr.rnr_retry`, 0..=7; 7 = retry forever). Default 7: the
    /// credit scheme keeps receive buffers posted, so RNR only happens when the peer process is stalled, and a
    /// stalled peer is "torpid", not lost (its node still answers).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code advertised to the peer (`ibv_qp_attr.min_rnr_timer`, 0..=31). Default 1
    /// (0.01 ms).
    pub min_rnr_timer: u8,
    /// Receive ring depth in fragments: the credits granted to the peer (messages it may have in flight or
    /// unconsumed here). Default 32. Range 2..=4096.
    pub depth: u32,
    /// Fragment size in bytes: one receive buffer; larger messages are split. Default 16384. Range
    /// 256..=1 MiB.
    pub frag_size: u32,
    /// Largest message accepted from the peer, in bytes (default 64 MiB, the wire format's `MAX_FRAME`
    /// plus the length prefix). A peer that sends more is a protocol error.
    pub max_message: u64,
    /// Messages (fragments) of at most this many bytes are sent inline (`IBV_SEND_INLINE`): the CPU copies
    /// them into the work request as it is posted, which spares the device a memory-region lookup and a read
    /// of the send buffer. Default 236, what perftest's latency tests use; 0 disables. The device may grant
    /// less (a device without inline sends: none) or more; the granted size is used. At most 1024.
    pub max_inline: u32,
    /// Poll the completion queue in a loop instead of sleeping on the completion channel's descriptor.
    /// Lower latency, one core kept busy per connection: for latency benchmarks only. Default false.
    pub busy_poll: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: 12,
            retry_cnt: 1,
            rnr_retry: 7,
            min_rnr_timer: 1,
            depth: 32,
            frag_size: 16384,
            max_message: 64 * 1024 * 1024 + 4,
            max_inline: 236,
            busy_poll: false,
        }
    }
}

/// Why a [`Config`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `timeout` 0 disables the retransmission timer (soft-RoCE never reports a dead peer); above 31 is invalid.
    #[error("rdma timeout {0} is invalid: use 1..=31 (0 means \"no retransmission timer\": a dead peer would never be reported; default 12 ≈ 16.8 ms per try)")]
    Timeout(u8),
    /// `retry_cnt` 7 means "retry forever" on soft-RoCE; 0 gave false errors on a healthy link.
    #[error("rdma retry_cnt {0} is invalid: use 1..=6 (7 means \"retry forever\" on soft-RoCE and 0 gives false errors; default 1)")]
    RetryCnt(u8),
    /// `rnr_retry` above 7.
    #[error("rdma rnr_retry {0} is invalid: use 0..=7")]
    RnrRetry(u8),
    /// `min_rnr_timer` above 31.
    #[error("rdma min_rnr_timer {0} is invalid: use 0..=31")]
    MinRnrTimer(u8),
    /// `depth` out of range.
    #[error("rdma ring depth {0} is invalid: use 2..=4096")]
    Depth(u32),
    /// `frag_size` out of range.
    #[error("rdma fragment size {0} is invalid: use 256..=1048576 bytes")]
    FragSize(u32),
    /// `max_message` is zero.
    #[error("rdma max_message must be at least 1 byte")]
    MaxMessage,
    /// `max_inline` above 1024.
    #[error("rdma max_inline {0} is invalid: use 0..=1024 bytes")]
    MaxInline(u32),
}

impl Config {
    /// Check every field; the error names the field and the valid range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.timeout == 0 || self.timeout > 31 {
            return Err(ConfigError::Timeout(self.timeout));
        }
        if self.retry_cnt == 0 || self.retry_cnt > 6 {
            return Err(ConfigError::RetryCnt(self.retry_cnt));
        }
        if self.rnr_retry > 7 {
            return Err(ConfigError::RnrRetry(self.rnr_retry));
        }
        if self.min_rnr_timer > 31 {
            return Err(ConfigError::MinRnrTimer(self.min_rnr_timer));
        }
        if !(2..=4096).contains(&self.depth) {
            return Err(ConfigError::Depth(self.depth));
        }
        if !(256..=1 << 20).contains(&self.frag_size) {
            return Err(ConfigError::FragSize(self.frag_size));
        }
        if self.max_message == 0 {
            return Err(ConfigError::MaxMessage);
        }
        if self.max_inline > 1024 {
            return Err(ConfigError::MaxInline(self.max_inline));
        }
        Ok(())
    }

    /// Expected time for an RC send to a dead peer to fail, in seconds: (retry_cnt + 1) × 4.096 µs ×
    /// 2^timeout. Soft-RoCE rounds each wait up to its timer tick (4 ms at HZ=250).
    pub fn detection_time(&self) -> f64 {
        (self.retry_cnt as f64 + 1.0) * 4.096e-6 * 2f64.powi(self.timeout as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_detect_a_dead_peer_in_about_40ms() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!((c.timeout, c.retry_cnt), (12, 1));
        let t = c.detection_time();
        assert!((0.030..0.040).contains(&t), "{t}");
    }

    #[test]
    fn never_forever() {
        let c = Config { retry_cnt: 7, ..Config::default() };
        let e = c.validate().unwrap_err();
        assert_eq!(e, ConfigError::RetryCnt(7));
        assert!(e.to_string().contains("forever"), "{e}");
        let c = Config { timeout: 0, ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().contains("no retransmission timer"));
        let c = Config { retry_cnt: 0, ..Config::default() };
        assert_eq!(c.validate(), Err(ConfigError::RetryCnt(0)));
        assert_eq!(Config { timeout: 32, ..Config::default() }.validate(), Err(ConfigError::Timeout(32)));
        assert_eq!(Config { depth: 1, ..Config::default() }.validate(), Err(ConfigError::Depth(1)));
        assert_eq!(Config { frag_size: 100, ..Config::default() }.validate(), Err(ConfigError::FragSize(100)));
        assert_eq!(Config { rnr_retry: 8, ..Config::default() }.validate(), Err(ConfigError::RnrRetry(8)));
        assert_eq!(Config { max_inline: 4096, ..Config::default() }.validate(), Err(ConfigError::MaxInline(4096)));
    }
}
