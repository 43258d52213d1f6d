//! Decoding a request's payload into its handler's `#[derive(Deserialize)]` struct ([`decode`]), with errors that
//! name the field.
//!
//! serde_json says what was wrong ("invalid type: string \"x\", expected u32") but not where;
//! `serde_path_to_error` tracks where. A refusal is EPROTO with one of
//!
//! - `'PATH': MESSAGE`: serde_json's message at the value's path, such as
//!   `'input.cores[3]': invalid type: string "x", expected u32`;
//! - `missing 'id' in request` (`missing 'input.id' in request` inside an object) for a required field;
//! - `payload: MESSAGE` for what is wrong with the payload as a whole.
//!
//! serde_json refuses what does not fit in a field's type (no truncation: a `u32` takes `0..=4294967295`);
//! `Option<T>` takes an absent field or `null`. Fields a struct does not name are ignored, as Flux ignores them: a
//! newer client may send more. A path names at most the first 64 characters of each key and a message is at most
//! 256 bytes (serde_json quotes the offending string), so that a refusal stays short whatever the request.

use super::ServiceError;
use serde::Deserialize;
use serde_json::Value;
use serde_path_to_error::Segment;
use std::fmt::Write as _;

/// The most characters of a key a refusal's path shows.
const KEY_MAX: usize = 64;

/// The most bytes of a refusal's message.
const MESSAGE_MAX: usize = 256;

/// Decode `v` (a request's JSON payload) into `T`, or refuse it with EPROTO naming the field at fault.
pub(super) fn decode<'de, T: Deserialize<'de>>(v: &'de Value) -> Result<T, ServiceError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let mut path = String::new();
        for s in e.path() {
            match s {
                Segment::Seq { index } => write!(path, "[{index}]").unwrap_or_default(),
                Segment::Map { key } | Segment::Enum { variant: key } => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.extend(key.chars().take(KEY_MAX));
                }
                Segment::Unknown => path.push_str(if path.is_empty() { "?" } else { ".?" }),
            }
        }
        let inner = e.inner().to_string();
        let missing = inner.strip_prefix("missing field `").and_then(|f| f.strip_suffix('`'));
        let mut message = match missing {
            Some(f) if path.is_empty() => format!("missing '{f}' in request"),
            Some(f) => format!("missing '{path}.{f}' in request"),
            None if path.is_empty() => format!("payload: {inner}"),
            None => format!("'{path}': {inner}"),
        };
        if message.len() > MESSAGE_MAX {
            let mut end = MESSAGE_MAX - "...".len();
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("...");
        }
        ServiceError::eproto(message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Fields of each kind the request structs have.
    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[allow(dead_code)]
    struct All {
        s: Option<String>,
        b: Option<bool>,
        n: Option<u32>,
        u: Option<u64>,
        neg: Option<i32>,
        f: Option<f64>,
        v: Option<Vec<u32>>,
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Inner {
        id: u32,
    }

    fn refusal(v: Value) -> String {
        let e = decode::<All>(&v).expect_err("refused");
        assert_eq!(e.errno, crate::message::errno::EPROTO, "{}", e.message);
        e.message
    }

    #[test]
    fn each_leaf_type_is_decoded_and_absent_or_null_is_none() {
        let all: All = decode(&json!({"s": "x", "b": true, "n": 5, "u": 7, "neg": -1, "f": 1.5, "v": [1, 2],
            "inner": {"id": 3}, "unknown": [{}]}))
        .expect("decoded");
        assert_eq!(all.s.as_deref(), Some("x"));
        assert_eq!((all.b, all.n, all.u, all.neg, all.f), (Some(true), Some(5), Some(7), Some(-1), Some(1.5)));
        assert_eq!((all.v, all.inner), (Some(vec![1, 2]), Some(Inner { id: 3 })));
        let none: All = decode(&json!({"s": null, "inner": null})).expect("decoded");
        assert_eq!((none.s, none.inner, none.f), (None, None, None));
        let max: All = decode(&json!({"n": u32::MAX})).expect("decoded");
        assert_eq!(max.n, Some(u32::MAX));
    }

    #[test]
    fn a_refusal_names_the_field_and_says_what_is_wrong() {
        assert_eq!(refusal(json!({"s": 1})), "'s': invalid type: integer `1`, expected a string");
        assert_eq!(refusal(json!({"b": "yes"})), "'b': invalid type: string \"yes\", expected a boolean");
        assert_eq!(refusal(json!({"n": 1u64 << 32})), "'n': invalid value: integer `4294967296`, expected u32");
        assert_eq!(refusal(json!({"n": 1.5})), "'n': invalid type: floating point `1.5`, expected u32");
        assert_eq!(refusal(json!({"u": -1})), "'u': invalid value: integer `-1`, expected u64");
        assert_eq!(refusal(json!({"neg": 1u64 << 32})), "'neg': invalid value: integer `4294967296`, expected i32");
        assert_eq!(refusal(json!({"f": "1"})), "'f': invalid type: string \"1\", expected f64");
        assert_eq!(refusal(json!({"v": {}})), "'v': invalid type: map, expected a sequence");
        assert_eq!(refusal(json!({"v": [1, "2"]})), "'v[1]': invalid type: string \"2\", expected u32");
        assert_eq!(refusal(json!({"inner": 1})), "'inner': invalid type: integer `1`, expected struct Inner");
        assert_eq!(refusal(json!({"inner": {}})), "missing 'inner.id' in request");
        assert_eq!(refusal(json!({"inner": {"id": null}})), "'inner.id': invalid type: null, expected u32");
        assert_eq!(decode::<Inner>(&json!({})).map_err(|e| e.message), Err("missing 'id' in request".to_string()));
        let e = decode::<Inner>(&json!("x")).expect_err("refused");
        assert_eq!(e.message, "payload: invalid type: string \"x\", expected struct Inner");
    }

    #[test]
    fn a_long_key_or_value_is_cut_in_the_refusal() {
        let long = "k".repeat(1000);
        let e = decode::<std::collections::BTreeMap<String, u32>>(&json!({ long.clone(): "x" })).expect_err("refused");
        assert_eq!(e.message, format!("'{}': invalid type: string \"x\", expected u32", &long[..64]));
        // serde_json quotes a string value whole: the message is cut, on a character boundary.
        let e = decode::<All>(&json!({ "s": null, "b": "é".repeat(1000) })).expect_err("refused");
        assert!(e.message.starts_with("'b': invalid type: string \"éé"), "{}", e.message);
        assert!(e.message.len() <= MESSAGE_MAX && e.message.ends_with("é..."), "{}", e.message);
    }
}
