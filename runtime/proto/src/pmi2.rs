//! PMI-2 wire protocol (MPICH's `src/pmi/maint/pmi-2.0.txt`; what Slurm's `srun --mpi=pmi2` serves): the
//! command codec.
//!
//! A command is a 6-byte ASCII decimal length (Slurm pads it on the right, MPICH's hydra on the left), then that
//! many bytes of `key=value;` pairs, the first being `cmd=NAME`. A `;` inside a value is written `;;` by the
//! specification; Slurm 22.05 does not understand that, so [`Command::encode`] refuses values containing `;`
//! instead. A session starts with one PMI-1 line (`cmd=init pmi_version=2 pmi_subversion=0`, see
//! [`crate::pmi::Line`]) whose answer says whether the server speaks PMI-2; framed commands follow. The blocking
//! client a broker uses to bootstrap under such a launcher is `vigil::pmi::Client`.

/// Bytes of the length header.
pub const HEADER: usize = 6;

/// Longest command body accepted (MPICH's client bound, `PMII_MAX_COMMAND_LEN`, 64 KiB).
pub const MAX_COMMAND: usize = 64 * 1024;

/// Longest key (`PMI2_MAX_KEYLEN`).
pub const MAX_KEYLEN: usize = 64;

/// Longest value (`PMI2_MAX_VALLEN`).
pub const MAX_VALLEN: usize = 1024;

/// A decoded PMI-2 command: its name and its other pairs, in order (duplicates kept, as `spawn` needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Value of the leading `cmd=` pair.
    pub cmd: String,
    /// Every other pair, in order of appearance.
    pub args: Vec<(String, String)>,
}

/// Why a PMI-2 command was rejected.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CommandError {
    /// The length header is not a decimal number.
    #[error("PMI-2 length header '{0}' is not a number")]
    BadHeader(String),
    /// Longer than [`MAX_COMMAND`].
    #[error("PMI-2 command of {0} bytes exceeds {MAX_COMMAND}")]
    TooLong(usize),
    /// Not UTF-8.
    #[error("PMI-2 command is not valid UTF-8")]
    NotUtf8,
    /// A pair without `=`.
    #[error("malformed PMI-2 pair '{0}' (expected key=value)")]
    BadPair(String),
    /// The first pair is not `cmd=`.
    #[error("PMI-2 command does not start with cmd= ('{0}')")]
    NoCmd(String),
    /// A key or value that cannot be sent: a `;` or `=` in a key, a `;` in a value, or longer than allowed.
    #[error("PMI-2 cannot send {0}")]
    Unsendable(String),
}

impl Command {
    /// A command `cmd=NAME;k=v;...` with the given pairs, in that order.
    pub fn new(cmd: &str, args: &[(&str, &str)]) -> Command {
        Command { cmd: cmd.to_string(), args: args.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// The length of the body that follows a 6-byte header.
    pub fn body_len(header: &[u8]) -> Result<usize, CommandError> {
        let h = String::from_utf8_lossy(header);
        let n: usize = h.trim().parse().map_err(|_| CommandError::BadHeader(h.chars().take(HEADER).collect()))?;
        if n > MAX_COMMAND {
            return Err(CommandError::TooLong(n));
        }
        Ok(n)
    }

    /// Parse a command body (what follows the header).
    pub fn parse(body: &[u8]) -> Result<Command, CommandError> {
        if body.len() > MAX_COMMAND {
            return Err(CommandError::TooLong(body.len()));
        }
        let s = std::str::from_utf8(body).map_err(|_| CommandError::NotUtf8)?;
        let mut cmd = None;
        let mut args = Vec::new();
        for pair in split_pairs(s) {
            let (k, v) = pair.split_once('=').ok_or_else(|| CommandError::BadPair(pair.chars().take(64).collect()))?;
            if cmd.is_none() {
                if k != "cmd" {
                    return Err(CommandError::NoCmd(pair.chars().take(64).collect()));
                }
                cmd = Some(v.to_string());
            } else {
                args.push((k.to_string(), v.to_string()));
            }
        }
        Ok(Command { cmd: cmd.ok_or_else(|| CommandError::NoCmd(String::new()))?, args })
    }

    /// Header and body, ready to write.
    pub fn encode(&self) -> Result<Vec<u8>, CommandError> {
        let mut body = String::new();
        for (k, v) in std::iter::once(("cmd", self.cmd.as_str())).chain(self.args.iter().map(|(k, v)| (&**k, &**v))) {
            if k.is_empty() || k.len() > MAX_KEYLEN || k.contains([';', '=']) {
                return Err(CommandError::Unsendable(format!("key '{}'", k.chars().take(64).collect::<String>())));
            }
            if v.len() > MAX_VALLEN || v.contains(';') {
                return Err(CommandError::Unsendable(format!("the value of '{k}' (a ';' or over {MAX_VALLEN} bytes)")));
            }
            body.push_str(k);
            body.push('=');
            body.push_str(v);
            body.push(';');
        }
        if body.len() > MAX_COMMAND {
            return Err(CommandError::TooLong(body.len()));
        }
        let mut out = format!("{:<6}", body.len()).into_bytes();
        out.extend_from_slice(body.as_bytes());
        Ok(out)
    }

    /// The value of the first pair named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// The pairs of a body: split at each single `;` (a `;;` is an escaped `;` in a value), empty pairs skipped.
fn split_pairs(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == ';' {
            if it.peek() == Some(&';') {
                it.next();
                cur.push(';');
            } else if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_command_round_trips_with_a_left_justified_header() {
        let c = Command::new("kvs-put", &[("key", "vigil.ep.3"), ("value", "10.0.0.3:4711")]);
        let wire = c.encode().unwrap();
        assert_eq!(&wire[..HEADER], b"47    ");
        assert_eq!(&wire[HEADER..], b"cmd=kvs-put;key=vigil.ep.3;value=10.0.0.3:4711;");
        assert_eq!(Command::body_len(&wire[..HEADER]), Ok(47));
        assert_eq!(Command::parse(&wire[HEADER..]).unwrap(), c);
    }

    #[test]
    fn servers_answers_parse_whatever_their_header_padding() {
        // Hydra pads on the left; the last pair may lack its ';'; `;;` is an escaped ';'.
        assert_eq!(Command::body_len(b"    52"), Ok(52));
        let c = Command::parse(b"cmd=fullinit-response;rc=0;rank=2;size=4;appnum=-1;x=a;;b").unwrap();
        assert_eq!(c.cmd, "fullinit-response");
        assert_eq!(
            (c.get("rc"), c.get("rank"), c.get("size"), c.get("x")),
            (Some("0"), Some("2"), Some("4"), Some("a;b"))
        );
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        assert!(matches!(Command::body_len(b"12a   "), Err(CommandError::BadHeader(_))));
        assert!(matches!(Command::body_len(b"999999"), Err(CommandError::TooLong(999_999))));
        assert!(matches!(Command::parse(b"rc=0;cmd=x;"), Err(CommandError::NoCmd(_))));
        assert!(matches!(Command::parse(b"cmd=x;novalue;"), Err(CommandError::BadPair(_))));
        assert!(matches!(Command::parse(b""), Err(CommandError::NoCmd(_))));
        assert!(matches!(Command::parse(&[0xff, 0xfe]), Err(CommandError::NotUtf8)));
        let semi = Command::new("kvs-put", &[("key", "k"), ("value", "a;b")]);
        assert!(matches!(semi.encode(), Err(CommandError::Unsendable(_))));
        let long = "v".repeat(MAX_VALLEN + 1);
        assert!(matches!(Command::new("kvs-put", &[("value", &long)]).encode(), Err(CommandError::Unsendable(_))));
    }

    proptest! {
        /// Whatever a server sends, parsing returns (never panics); what we can encode parses back to itself.
        #[test]
        fn parse_never_panics_and_encode_round_trips(
            junk in proptest::collection::vec(any::<u8>(), 0..256),
            pairs in proptest::collection::vec(("[a-z][a-z0-9-]{0,15}", "[ -:<-~]{0,40}"), 0..8),
        ) {
            let _ = Command::body_len(&junk[..junk.len().min(HEADER)]);
            let _ = Command::parse(&junk);
            let args: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let c = Command::new("kvs-put", &args);
            let wire = c.encode().unwrap();
            let n = Command::body_len(&wire[..HEADER]).unwrap();
            prop_assert_eq!(n, wire.len() - HEADER);
            let back = Command::parse(&wire[HEADER..]).unwrap();
            // Empty values parse back as empty; pairs keep their order.
            prop_assert_eq!(back, c);
        }
    }
}
