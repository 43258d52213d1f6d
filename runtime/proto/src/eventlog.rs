//! Event logs, following Flux RFC 18 ("KVS Event Log Format").
//!
//! An eventlog is a sequence of events, one JSON object per line, each line
//! terminated by a newline (JSON Lines). Each event object has:
//!
//! - `timestamp`: number, seconds since the Unix epoch (fractional), `>= 0`;
//! - `name`: non-empty string naming the event (e.g. `"submit"`);
//! - `context`: optional object of event-specific data (omitted when empty).
//!
//! This implementation rejects any other key in an event object so that
//! parsing and re-encoding never silently drops data.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use thiserror::Error;

/// Errors returned by the eventlog parsers and [`Event::new`] (RFC 18).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventlogError {
    /// The line was not valid JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The line was valid JSON but not an object.
    #[error("event must be a JSON object")]
    NotObject,
    /// `timestamp` was missing, not a number, negative, or not finite.
    #[error("timestamp: must be a non-negative number")]
    Timestamp,
    /// `name` was missing, not a string, or empty.
    #[error("name: must be a non-empty string")]
    Name,
    /// `context` was present but not an object.
    #[error("context: must be an object")]
    Context,
    /// The event object had a key other than `timestamp`, `name`, `context`.
    #[error("unknown key {0:?} in event")]
    UnknownKey(String),
    /// An event line contained an embedded newline (only [`Event::parse_line`]).
    #[error("event line contains a newline")]
    EmbeddedNewline,
    /// An error in a multi-line log, with its 1-based line number.
    #[error("line {line}: {source}")]
    Line {
        /// 1-based line number within the log.
        line: usize,
        /// The error for that line.
        #[source]
        source: Box<EventlogError>,
    },
}

/// One RFC 18 event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch (fractional), `>= 0`.
    pub timestamp: f64,
    /// Event name, non-empty (e.g. `"submit"`, `"alloc"`, `"finish"`).
    pub name: String,
    /// Event-specific data; omitted from the JSON encoding when empty.
    pub context: Map<String, Value>,
}

/// Current wall-clock time as seconds since the Unix epoch, rounded to
/// microseconds (as Flux eventlogs record it, which also makes the value
/// survive a JSON round trip exactly); 0.0 if the clock reads before the epoch.
pub fn now_timestamp() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as f64 / 1e6).unwrap_or(0.0)
}

impl Event {
    /// Create an event named `name`, stamped with the current time.
    ///
    /// `context` must be a JSON object or `null` (meaning empty context).
    ///
    /// # Errors
    /// [`EventlogError::Name`] if `name` is empty; [`EventlogError::Context`]
    /// if `context` is neither an object nor `null`.
    pub fn new(name: impl Into<String>, context: Value) -> Result<Event, EventlogError> {
        Event::with_timestamp(now_timestamp(), name, context)
    }

    /// An event produced by Vigil itself at `timestamp` (seconds since the epoch): never fails. A negative or
    /// non-finite time is clamped to 0 and a context that is not an object is stored under `"value"`.
    pub fn with_time(timestamp: f64, name: &str, context: Value) -> Event {
        let timestamp = if timestamp.is_finite() && timestamp >= 0.0 { (timestamp * 1e6).round() / 1e6 } else { 0.0 };
        let context = match context {
            Value::Null => Map::new(),
            Value::Object(m) => m,
            other => {
                let mut m = Map::new();
                m.insert("value".into(), other);
                m
            }
        };
        Event { timestamp, name: name.to_string(), context }
    }

    /// Like [`Event::new`] with an explicit `timestamp` (seconds since epoch).
    ///
    /// # Errors
    /// As [`Event::new`], plus [`EventlogError::Timestamp`] if `timestamp` is
    /// negative or not finite.
    pub fn with_timestamp(timestamp: f64, name: impl Into<String>, context: Value) -> Result<Event, EventlogError> {
        if !(timestamp.is_finite() && timestamp >= 0.0) {
            return Err(EventlogError::Timestamp);
        }
        let name = name.into();
        if name.is_empty() {
            return Err(EventlogError::Name);
        }
        let context = match context {
            Value::Null => Map::new(),
            Value::Object(m) => m,
            _ => return Err(EventlogError::Context),
        };
        Ok(Event { timestamp, name, context })
    }

    /// Encode as a single-line JSON object without a trailing newline, keys
    /// in RFC 18 order, e.g.
    /// `{"timestamp":1.5,"name":"submit","context":{"urgency":16}}`.
    /// `context` is omitted when empty; its keys are written sorted. A
    /// non-finite `timestamp` (only possible by setting the field directly)
    /// is written as `null`, which [`Event::parse_line`] rejects.
    pub fn to_line(&self) -> String {
        // Serialized in place (serde_json writes a non-finite number as `null`): no copy of the context.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse and validate one event line (a trailing `\n` or `\r\n` is allowed).
    ///
    /// # Errors
    /// [`EventlogError`] if the line is not a JSON object, `timestamp` is not a
    /// non-negative finite number, `name` is not a non-empty string, `context`
    /// is present but not an object, or an unknown key is present.
    pub fn parse_line(line: &str) -> Result<Event, EventlogError> {
        let body = line.strip_suffix('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).unwrap_or(line);
        if body.contains('\n') {
            return Err(EventlogError::EmbeddedNewline);
        }
        let value: Value = serde_json::from_str(body).map_err(|e| EventlogError::Json(e.to_string()))?;
        let Value::Object(mut obj) = value else {
            return Err(EventlogError::NotObject);
        };
        let timestamp = match obj.remove("timestamp") {
            Some(Value::Number(n)) => n.as_f64().ok_or(EventlogError::Timestamp)?,
            _ => return Err(EventlogError::Timestamp),
        };
        if !(timestamp.is_finite() && timestamp >= 0.0) {
            return Err(EventlogError::Timestamp);
        }
        let name = match obj.remove("name") {
            Some(Value::String(s)) if !s.is_empty() => s,
            _ => return Err(EventlogError::Name),
        };
        let context = match obj.remove("context") {
            None => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => return Err(EventlogError::Context),
        };
        if let Some(key) = obj.keys().next() {
            return Err(EventlogError::UnknownKey(key.clone()));
        }
        Ok(Event { timestamp, name, context })
    }
}

/// The RFC 18 object of an event, read ([`Event`]'s `Deserialize`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EventIn {
    timestamp: f64,
    name: String,
    #[serde(default)]
    context: Map<String, Value>,
}

/// An event from the JSON object [`Event::parse_line`] takes, checked as it checks it (a non-negative finite
/// `timestamp`, a non-empty `name`, an object `context`, no other key).
impl<'de> serde::Deserialize<'de> for Event {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        use serde::de::Error as _;
        let e = EventIn::deserialize(d)?;
        if !(e.timestamp.is_finite() && e.timestamp >= 0.0) {
            return Err(D::Error::custom(EventlogError::Timestamp));
        }
        if e.name.is_empty() {
            return Err(D::Error::custom(EventlogError::Name));
        }
        Ok(Event { timestamp: e.timestamp, name: e.name, context: e.context })
    }
}

/// Parse a whole RFC 18 eventlog (newline-separated JSON objects).
///
/// The final newline is optional; an empty string is an empty log. Blank
/// lines elsewhere are errors.
///
/// # Errors
/// [`EventlogError::Line`] carrying the 1-based line number and the
/// underlying [`Event::parse_line`] error.
pub fn parse_eventlog(log: &str) -> Result<Vec<Event>, EventlogError> {
    if log.is_empty() {
        return Ok(Vec::new());
    }
    let body = log.strip_suffix('\n').unwrap_or(log);
    body.split('\n')
        .enumerate()
        .map(|(i, line)| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            Event::parse_line(line).map_err(|e| EventlogError::Line { line: i + 1, source: Box::new(e) })
        })
        .collect()
}

/// Encode events as an RFC 18 eventlog: each [`Event::to_line`] followed by
/// a newline.
pub fn format_eventlog(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        out.push_str(&e.to_line());
        out.push('\n');
    }
    out
}

impl serde::Serialize for Event {
    /// Serializes as the RFC 18 object: `{"timestamp", "name", "context"}` (context omitted when empty).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("timestamp", &self.timestamp)?;
        m.serialize_entry("name", &self.name)?;
        if !self.context.is_empty() {
            m.serialize_entry("context", &self.context)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn round_trips_rfc18_example() {
        let log = concat!(
            "{\"timestamp\":1552593348.073045,\"name\":\"submit\",\"context\":{\"flags\":0,\"urgency\":16,\"userid\":5588}}\n",
            "{\"timestamp\":1552593348.088391,\"name\":\"alloc\"}\n",
            "{\"timestamp\":1552593348.093541,\"name\":\"start\"}\n",
        );
        let events = parse_eventlog(log).expect("valid log");
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].name, "submit");
        assert_eq!(events[0].context.get("urgency"), Some(&json!(16)));
        assert_eq!(events[1].timestamp, 1552593348.088391);
        assert!(events[1].context.is_empty());
        assert_eq!(format_eventlog(&events), log);
    }

    #[test]
    fn to_line_omits_empty_context() {
        let e = Event::with_timestamp(2.5, "start", Value::Null).expect("valid");
        assert_eq!(e.to_line(), r#"{"timestamp":2.5,"name":"start"}"#);
        let e = Event::with_timestamp(0.0, "x", json!({"a": 1})).expect("valid");
        assert_eq!(e.to_line(), r#"{"timestamp":0.0,"name":"x","context":{"a":1}}"#);
        assert!(!e.to_line().ends_with('\n'));
    }

    /// serde reads and writes the object `to_line` and `parse_line` do, and refuses what `parse_line` refuses.
    #[test]
    fn serde_is_the_line_format() {
        let e = Event::with_timestamp(1_796_000_000.123456, "alloc", json!({"b": [1], "a": "x\ny"})).expect("valid");
        assert_eq!(serde_json::to_string(&e).unwrap(), e.to_line());
        assert_eq!(serde_json::from_str::<Event>(&e.to_line()).unwrap(), e);
        let plain = Event::with_timestamp(3.0, "clean", Value::Null).expect("valid");
        assert_eq!(serde_json::from_value::<Event>(json!({"timestamp": 3, "name": "clean"})).unwrap(), plain);
        for bad in [
            json!({"timestamp": -1.0, "name": "x"}),
            json!({"timestamp": 1.0, "name": ""}),
            json!({"timestamp": 1.0, "name": "x", "context": [1]}),
            json!({"timestamp": 1.0, "name": "x", "extra": 1}),
            json!({"name": "x"}),
        ] {
            assert!(Event::parse_line(&bad.to_string()).is_err(), "{bad}");
            assert!(serde_json::from_value::<Event>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn new_uses_current_time() {
        let before = now_timestamp();
        let e = Event::new("submit", json!({"urgency": 16})).expect("valid");
        assert!(e.timestamp >= before && e.timestamp > 1.0e9);
        assert_eq!(Event::parse_line(&e.to_line()), Ok(e));
        assert_eq!(Event::new("", Value::Null), Err(EventlogError::Name));
        assert_eq!(Event::new("x", json!([1])), Err(EventlogError::Context));
        assert_eq!(Event::with_timestamp(-1.0, "x", Value::Null), Err(EventlogError::Timestamp));
    }

    #[test]
    fn parse_line_validates() {
        let cases = [
            ("", "invalid JSON"),
            ("[]", "JSON object"),
            (r#"{"name":"x"}"#, "timestamp"),
            (r#"{"timestamp":"1","name":"x"}"#, "timestamp"),
            (r#"{"timestamp":-1,"name":"x"}"#, "timestamp"),
            (r#"{"timestamp":1}"#, "name"),
            (r#"{"timestamp":1,"name":""}"#, "name"),
            (r#"{"timestamp":1,"name":3}"#, "name"),
            (r#"{"timestamp":1,"name":"x","context":[]}"#, "context"),
            (r#"{"timestamp":1,"name":"x","extra":1}"#, "unknown key"),
            ("{\"timestamp\":1,\n\"name\":\"x\"}", "newline"),
        ];
        for (line, want) in cases {
            let err = Event::parse_line(line).expect_err(line).to_string();
            assert!(err.contains(want), "{line:?}: {err}");
        }
        assert!(Event::parse_line("{\"timestamp\":1,\"name\":\"x\"}\n").is_ok());
        assert!(Event::parse_line("{\"timestamp\":1,\"name\":\"x\"}\r\n").is_ok());
    }

    #[test]
    fn eventlog_errors_name_line() {
        let log = "{\"timestamp\":1,\"name\":\"a\"}\n{\"timestamp\":2}\n";
        let err = parse_eventlog(log).expect_err("bad log");
        assert!(matches!(err, EventlogError::Line { line: 2, .. }), "{err}");
        assert_eq!(err.to_string(), "line 2: name: must be a non-empty string");
        let err = parse_eventlog("{\"timestamp\":1,\"name\":\"a\"}\n\n").expect_err("blank");
        assert!(matches!(err, EventlogError::Line { line: 2, .. }), "{err}");
        assert_eq!(parse_eventlog(""), Ok(vec![]));
        assert!(matches!(parse_eventlog("\n"), Err(EventlogError::Line { line: 1, .. })));
    }

    proptest! {
        #[test]
        fn parse_line_never_panics(s in "\\PC*") {
            let _ = Event::parse_line(&s);
            let _ = parse_eventlog(&s);
        }

        #[test]
        fn parse_line_never_panics_jsonish(s in "[{}\\[\\]\":,a-z0-9.\\-\\n ]{0,40}") {
            let _ = Event::parse_line(&s);
            let _ = parse_eventlog(&s);
        }

        #[test]
        fn line_round_trips(ts in 0.0f64..2.0e9, name in "[a-z][a-z-]{0,10}", v in any::<i64>()) {
            let e = Event::with_timestamp(ts, name, json!({"v": v, "s": "x\ny"}));
            prop_assert!(e.is_ok());
            if let Ok(e) = e {
                let back = Event::parse_line(&e.to_line());
                prop_assert!(back.is_ok());
                if let Ok(back) = back {
                    // serde_json's fast float parser may be 1 ULP off for
                    // 17-significant-digit values.
                    prop_assert!((back.timestamp - e.timestamp).abs() <= e.timestamp * 4.0 * f64::EPSILON);
                    prop_assert_eq!(&back.name, &e.name);
                    prop_assert_eq!(&back.context, &e.context);
                }
                // Microsecond-resolution timestamps round-trip exactly.
                let micro = Event { timestamp: (e.timestamp * 1e6).round() / 1e6, ..e };
                prop_assert_eq!(Event::parse_line(&micro.to_line()), Ok(micro));
            }
        }
    }
}
