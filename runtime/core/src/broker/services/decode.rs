//! Decoding a request's payload into its handler's `#[derive(Deserialize)]` struct ([`decode`]), with errors that
//! name the field.
//!
//! serde_json's own decoder says "invalid type: string \"x\", expected u32" and not which field it was reading, so
//! the payload's JSON tree (already parsed by `Body`) is walked here instead: a small [`Deserializer`] over a
//! [`Value`] that knows the path it stands at (`input.cores[3]`) and puts it into every error. A refusal is
//! EPROTO with one of
//!
//! - `missing 'id' in request` (`missing 'input.id' in request` inside an object);
//! - `'id' must be a job id (an integer or an f58 string), got an array`: what was wanted (the leaf types below,
//!   else what the field's type says it expects), and what the JSON value is;
//! - `'input': ...` for anything else a type's `Deserialize` says.
//!
//! | Rust field type | JSON it takes | else "must be ..." |
//! |---|---|---|
//! | `String` | a string | a string |
//! | `bool` | `true`, `false` | a boolean |
//! | `u64` | an integer `>= 0` | a non-negative integer |
//! | `u32` | an integer `0..=4294967295` (never truncated) | an integer 0..=4294967295 |
//! | `i32` | an integer that fits in 32 bits | an integer that fits in 32 bits |
//! | `f64` | a number | a number |
//! | `Option<T>` | absent, `null`, or what `T` takes | |
//! | `Vec<T>`, a struct, a map | an array, an object, an object | an array, an object, an object |
//!
//! Fields a struct does not name are ignored, as Flux ignores them: a newer client may send more. A path names at
//! most the first 64 characters of each key, so that a refusal stays short whatever the request.

use super::ServiceError;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// Decode `v` (a request's JSON payload) into `T`, or refuse it with EPROTO naming the field at fault.
pub(super) fn decode<'de, T: Deserialize<'de>>(v: &'de Value) -> Result<T, ServiceError> {
    T::deserialize(Field { parent: "", key: Key::Root, value: v }).map_err(|e| match e {
        DecodeError::Named(m) => ServiceError::eproto(m),
        e => ServiceError::eproto(e.to_string()),
    })
}

/// What a JSON value is, for error messages ("an array").
pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An error while decoding, before ([`DecodeError::Wrong`], [`DecodeError::Missing`], [`DecodeError::Other`]) or
/// after ([`DecodeError::Named`]) the [`Field`] it arose in has put its path into it.
#[derive(Debug)]
enum DecodeError {
    /// The finished message, naming its field.
    Named(String),
    /// A value of the wrong type or out of range: what was wanted, what the value is ("a string").
    Wrong { want: String, got: &'static str },
    /// A struct's required field, absent.
    Missing(&'static str),
    /// Anything else a `Deserialize` impl said.
    Other(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Named(m) | DecodeError::Other(m) => f.write_str(m),
            DecodeError::Wrong { want, got } => write!(f, "payload must be {want}, got {got}"),
            DecodeError::Missing(name) => write!(f, "missing '{name}' in request"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DecodeError::Other(msg.to_string())
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        // serde's words for JSON's kinds, in JSON's.
        let want = match exp.to_string() {
            w if w == "a sequence" => "an array".to_string(),
            w if w == "a map" => "an object".to_string(),
            w => w,
        };
        let got = match unexp {
            de::Unexpected::Bool(_) => "a boolean",
            de::Unexpected::Unsigned(_) | de::Unexpected::Signed(_) | de::Unexpected::Float(_) => "a number",
            de::Unexpected::Char(_) | de::Unexpected::Str(_) => "a string",
            de::Unexpected::Unit | de::Unexpected::Option => "null",
            de::Unexpected::Seq => "an array",
            de::Unexpected::Map => "an object",
            _ => "another value",
        };
        DecodeError::Wrong { want, got }
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::invalid_type(unexp, exp)
    }

    fn missing_field(field: &'static str) -> Self {
        DecodeError::Missing(field)
    }
}

/// Where a [`Field`] stands in its parent.
#[derive(Clone, Copy)]
enum Key<'de> {
    /// The payload itself.
    Root,
    /// A field of an object.
    Name(&'de str),
    /// An element of an array.
    Index(usize),
}

/// A JSON value being decoded, and its path: `parent` (the path of the object or array it is in, `""` at the top)
/// and its `key` there.
struct Field<'p, 'de> {
    parent: &'p str,
    key: Key<'de>,
    value: &'de Value,
}

impl Field<'_, '_> {
    /// This value's path (`input.cores[3]`; empty for the payload), each key cut to 64 characters.
    fn path(&self) -> String {
        let sep = if self.parent.is_empty() { "" } else { "." };
        match self.key {
            Key::Root => String::new(),
            Key::Name(k) => format!("{}{sep}{}", self.parent, k.chars().take(64).collect::<String>()),
            Key::Index(i) => format!("{}[{i}]", self.parent),
        }
    }

    /// `e`, arisen at this value, with its path put in.
    fn place(&self, e: DecodeError) -> DecodeError {
        let path = self.path();
        match e {
            DecodeError::Named(_) => e,
            // A missing field is of the object here: its path is this one's, and the field.
            DecodeError::Missing(f) if path.is_empty() => DecodeError::Named(format!("missing '{f}' in request")),
            DecodeError::Missing(f) => DecodeError::Named(format!("missing '{path}.{f}' in request")),
            _ if path.is_empty() => e,
            DecodeError::Wrong { want, got } => DecodeError::Named(format!("'{path}' must be {want}, got {got}")),
            DecodeError::Other(m) => DecodeError::Named(format!("'{path}': {m}")),
        }
    }

    /// Wrong type: `want`ed, and what this value is.
    fn wrong(&self, want: &str) -> DecodeError {
        self.place(DecodeError::Wrong { want: want.to_string(), got: json_kind(self.value) })
    }
}

impl<'de> Deserializer<'de> for Field<'_, 'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let r = match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => visitor.visit_u64(u),
                (None, Some(i)) => visitor.visit_i64(i),
                (None, None) => visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(a) => visitor.visit_seq(Elements { path: self.path(), iter: a.iter().enumerate() }),
            Value::Object(o) => visitor.visit_map(Entries { path: self.path(), iter: o.iter(), next: None }),
        };
        r.map_err(|e| self.place(e))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Bool(b) => visitor.visit_bool(*b).map_err(|e| self.place(e)),
            _ => Err(self.wrong("a boolean")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::String(s) => visitor.visit_borrowed_str(s).map_err(|e| self.place(e)),
            _ => Err(self.wrong("a string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value.as_u64() {
            Some(n) => visitor.visit_u64(n).map_err(|e| self.place(e)),
            None => Err(self.wrong("a non-negative integer")),
        }
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => visitor.visit_u32(n).map_err(|e| self.place(e)),
            None => Err(self.wrong("an integer 0..=4294967295")),
        }
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value.as_i64().and_then(|n| i32::try_from(n).ok()) {
            Some(n) => visitor.visit_i32(n).map_err(|e| self.place(e)),
            None => Err(self.wrong("an integer that fits in 32 bits")),
        }
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value.as_f64() {
            Some(n) => visitor.visit_f64(n).map_err(|e| self.place(e)),
            None => Err(self.wrong("a number")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Array(_) => self.deserialize_any(visitor),
            _ => Err(self.wrong("an array")),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self.value {
            Value::Object(_) => self.deserialize_any(visitor),
            _ => Err(self.wrong("an object")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self.value {
            // A unit variant, the common case.
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()).map_err(|e| self.place(e)),
            // The rest as serde_json decodes them (`{"Variant": ...}`).
            v => v.deserialize_enum(name, variants, visitor).map_err(|e| self.place(DecodeError::Other(e.to_string()))),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i64 i128 u8 u16 u128 f32 char bytes byte_buf unit unit_struct tuple tuple_struct identifier
    }
}

/// The elements of an array at `path`.
struct Elements<'de> {
    path: String,
    iter: std::iter::Enumerate<std::slice::Iter<'de, Value>>,
}

impl<'de> SeqAccess<'de> for Elements<'de> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DecodeError> {
        match self.iter.next() {
            Some((i, value)) => seed.deserialize(Field { parent: &self.path, key: Key::Index(i), value }).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// The fields of an object at `path`; `next` is the one whose key was just read.
struct Entries<'de> {
    path: String,
    iter: serde_json::map::Iter<'de>,
    next: Option<(&'de str, &'de Value)>,
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DecodeError> {
        match self.iter.next() {
            Some((k, v)) => {
                self.next = Some((k.as_str(), v));
                seed.deserialize(de::value::BorrowedStrDeserializer::new(k)).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DecodeError> {
        let (k, value) = self.next.take().ok_or_else(|| DecodeError::Other("a value before its key".into()))?;
        seed.deserialize(Field { parent: &self.path, key: Key::Name(k), value })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every leaf type of the table, one of each.
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
    }

    #[test]
    fn a_refusal_names_the_field_what_it_must_be_and_what_it_is() {
        assert_eq!(refusal(json!({"s": 1})), "'s' must be a string, got a number");
        assert_eq!(refusal(json!({"b": "yes"})), "'b' must be a boolean, got a string");
        assert_eq!(refusal(json!({"n": 1u64 << 32})), "'n' must be an integer 0..=4294967295, got a number");
        assert_eq!(refusal(json!({"n": 1.5})), "'n' must be an integer 0..=4294967295, got a number");
        assert_eq!(refusal(json!({"u": -1})), "'u' must be a non-negative integer, got a number");
        assert_eq!(refusal(json!({"neg": 1u64 << 32})), "'neg' must be an integer that fits in 32 bits, got a number");
        assert_eq!(refusal(json!({"f": "1"})), "'f' must be a number, got a string");
        assert_eq!(refusal(json!({"v": {}})), "'v' must be an array, got an object");
        assert_eq!(refusal(json!({"v": [1, "2"]})), "'v[1]' must be an integer 0..=4294967295, got a string");
        assert_eq!(refusal(json!({"inner": []})), "'inner' must be an object, got an array");
        assert_eq!(refusal(json!({"inner": {}})), "missing 'inner.id' in request");
        assert_eq!(refusal(json!({"inner": {"id": null}})), "'inner.id' must be an integer 0..=4294967295, got null");
        assert_eq!(decode::<Inner>(&json!({})).map_err(|e| e.message), Err("missing 'id' in request".to_string()));
    }

    #[test]
    fn a_long_key_is_cut_in_the_refusal() {
        let long = "k".repeat(1000);
        let e = decode::<std::collections::BTreeMap<String, u32>>(&json!({ long.clone(): "x" })).expect_err("refused");
        assert!(e.message.len() < 120 && e.message.contains(&long[..64]), "{}", e.message);
    }
}
