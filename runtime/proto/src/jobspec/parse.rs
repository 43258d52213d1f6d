//! Structural parsing (text or JSON value to [`Jobspec`]) following RFC 14: types and allowed keys, each error
//! naming its field path. The RFC 25 V1 rules applied after this are in `validate.rs`; the types are in `mod.rs`.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::{invalid, Attributes, Count, CountRange, Jobspec, JobspecError, Resource, Shell, System, Task, TaskCount};

fn check_keys(obj: &Map<String, Value>, allowed: &[&str], path: &str) -> Result<(), JobspecError> {
    for key in obj.keys() {
        if !allowed.contains(&key.as_str()) {
            let p = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            return Err(invalid(p, format!("unknown key (expected one of: {})", allowed.join(", "))));
        }
    }
    Ok(())
}

fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, JobspecError> {
    v.as_object().ok_or_else(|| invalid(path, "must be a mapping"))
}

fn as_count_int(v: &Value, path: &str) -> Result<u64, JobspecError> {
    v.as_u64().ok_or_else(|| invalid(path, "must be an integer >= 1"))
}

fn as_string(v: &Value, path: &str) -> Result<String, JobspecError> {
    v.as_str().map(str::to_string).ok_or_else(|| invalid(path, "must be a string"))
}

/// An integer `>= 1` (RFC 14's "positive integer").
fn as_positive_int(v: &Value, path: &str) -> Result<u64, JobspecError> {
    v.as_u64().filter(|n| *n >= 1).ok_or_else(|| invalid(path, "must be an integer >= 1"))
}

/// RFC 14 count: an integer, a range mapping `{min, max?, operator?, operand?}` with RFC 14's rules (`min` and
/// `operand` positive, `max >= min`, `operator` and `operand` together, `operand >= 2` for `*` and `^`, `min >= 2`
/// for `^`), or a count string (an RFC 22 idset or an RFC 45 range; only its characters are checked here, since
/// V1 refuses it anyway). Integer counts of 0 pass here: which types may be 0 is [`Jobspec::validate`]'s rule.
fn parse_count(v: &Value, path: &str) -> Result<Count, JobspecError> {
    match v {
        Value::Object(obj) => {
            check_keys(obj, &["min", "max", "operator", "operand"], path)?;
            let min_path = format!("{path}.min");
            let min = as_positive_int(obj.get("min").ok_or_else(|| invalid(&min_path, "required"))?, &min_path)?;
            let max = obj.get("max").map(|m| as_positive_int(m, &format!("{path}.max"))).transpose()?;
            if max.is_some_and(|max| max < min) {
                return Err(invalid(format!("{path}.max"), "must be >= min"));
            }
            let operator = match obj.get("operator") {
                None => None,
                Some(Value::String(s)) if matches!(s.as_str(), "+" | "*" | "^") => Some(s.clone()),
                Some(_) => return Err(invalid(format!("{path}.operator"), "must be one of +, *, ^")),
            };
            let operand = obj.get("operand").map(|m| as_positive_int(m, &format!("{path}.operand"))).transpose()?;
            match (&operator, operand) {
                (Some(_), None) => return Err(invalid(format!("{path}.operand"), "required with operator (RFC 14)")),
                (None, Some(_)) => return Err(invalid(format!("{path}.operator"), "required with operand (RFC 14)")),
                (Some(op), Some(n)) if op != "+" && n < 2 => {
                    return Err(invalid(format!("{path}.operand"), format!("must be >= 2 with operator {op}")))
                }
                (Some(op), _) if op == "^" && min < 2 => return Err(invalid(min_path, "must be >= 2 with operator ^")),
                _ => {}
            }
            Ok(Count::Range(CountRange { min, max, operator, operand }))
        }
        Value::String(s) => {
            let idset = crate::idset::IdSet::parse(s).is_ok_and(|ids| !ids.is_empty());
            let range = s.bytes().any(|b| b.is_ascii_digit())
                && s.bytes().all(|b| b.is_ascii_digit() || b"-+:*^[]".contains(&b));
            if idset || range {
                Ok(Count::Text(s.clone()))
            } else {
                Err(invalid(path, "must be an integer, a mapping {min, max, operator, operand}, or a count string (an RFC 22 idset or RFC 45 range)"))
            }
        }
        _ => as_count_int(v, path).map(Count::Fixed),
    }
}

fn parse_resource(v: &Value, path: &str) -> Result<Resource, JobspecError> {
    let obj = as_object(v, path)?;
    check_keys(obj, &["type", "count", "unit", "label", "exclusive", "with", "id"], path)?;
    let kind = match obj.get("type") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(invalid(format!("{path}.type"), "required non-empty string")),
    };
    let count_path = format!("{path}.count");
    let count = parse_count(obj.get("count").ok_or_else(|| invalid(&count_path, "required"))?, &count_path)?;
    let label = obj.get("label").map(|l| as_string(l, &format!("{path}.label"))).transpose()?;
    let unit = obj.get("unit").map(|u| as_string(u, &format!("{path}.unit"))).transpose()?;
    let id = obj.get("id").map(|u| as_string(u, &format!("{path}.id"))).transpose()?;
    let exclusive = match obj.get("exclusive") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(invalid(format!("{path}.exclusive"), "must be a boolean")),
    };
    let with = match obj.get("with") {
        None => Vec::new(),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(invalid(format!("{path}.with"), "must contain at least one resource (RFC 14), or be left out"))
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| parse_resource(item, &format!("{path}.with[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid(format!("{path}.with"), "must be a list of resources")),
    };
    Ok(Resource { kind, count, label, exclusive, unit, id, with })
}

fn parse_task(v: &Value, path: &str) -> Result<Task, JobspecError> {
    let obj = as_object(v, path)?;
    check_keys(obj, &["command", "slot", "count", "attributes", "distribution"], path)?;
    let cmd_err = || invalid(format!("{path}.command"), "must be a non-empty array of strings");
    let command = match obj.get("command") {
        Some(Value::Array(items)) => {
            items.iter().map(|a| a.as_str().map(str::to_string).ok_or_else(cmd_err)).collect::<Result<Vec<_>, _>>()?
        }
        _ => return Err(cmd_err()),
    };
    let slot = match obj.get("slot") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(invalid(format!("{path}.slot"), "required string (the slot label)")),
    };
    let count_path = format!("{path}.count");
    let count_obj = as_object(obj.get("count").ok_or_else(|| invalid(&count_path, "required"))?, &count_path)?;
    check_keys(count_obj, &["per_slot", "total", "per_resource"], &count_path)?;
    let count = match (count_obj.get("per_slot"), count_obj.get("total"), count_obj.get("per_resource")) {
        (Some(n), None, None) => TaskCount::PerSlot(as_count_int(n, &format!("{count_path}.per_slot"))?),
        (None, Some(n), None) => TaskCount::Total(as_count_int(n, &format!("{count_path}.total"))?),
        (None, None, Some(r)) => {
            let p = format!("{count_path}.per_resource");
            let r = as_object(r, &p)?;
            check_keys(r, &["type", "count"], &p)?;
            let kind = match r.get("type") {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                _ => return Err(invalid(format!("{p}.type"), "required non-empty string")),
            };
            let count_p = format!("{p}.count");
            let count = as_positive_int(r.get("count").ok_or_else(|| invalid(&count_p, "required"))?, &count_p)?;
            TaskCount::PerResource { kind, count }
        }
        _ => return Err(invalid(count_path, "must have exactly one of per_slot, total or per_resource")),
    };
    let attributes = obj.get("attributes").map(|a| as_object(a, &format!("{path}.attributes")).cloned()).transpose()?;
    let distribution = obj.get("distribution").map(|d| as_string(d, &format!("{path}.distribution"))).transpose()?;
    Ok(Task { command, slot, count, attributes, distribution })
}

fn parse_system(v: &Value) -> Result<System, JobspecError> {
    let path = "attributes.system";
    let obj = as_object(v, path)?;
    let mut sys = System::default();
    for (key, value) in obj {
        let p = format!("{path}.{key}");
        match key.as_str() {
            "duration" => {
                let d = value
                    .as_f64()
                    .filter(|d| d.is_finite() && *d >= 0.0)
                    .ok_or_else(|| invalid(&p, "must be a number of seconds >= 0"))?;
                sys.duration = Some(d);
            }
            "cwd" => sys.cwd = Some(as_string(value, &p)?),
            "environment" => {
                for (name, val) in as_object(value, &p)? {
                    // RFC 14: null unsets the variable. The tasks' environment is this mapping (and the shell's
                    // own variables), so an unset variable is one left out.
                    if val.is_null() {
                        continue;
                    }
                    let s = as_string(val, &format!("{p}.{name}"))?;
                    sys.environment.insert(name.clone(), s);
                }
            }
            "shell" => {
                let shell_obj = as_object(value, &p)?;
                let mut shell = Shell::default();
                for (sk, sv) in shell_obj {
                    if sk == "options" {
                        shell.options = as_object(sv, &format!("{p}.options"))?.clone();
                    } else {
                        shell.other.insert(sk.clone(), sv.clone());
                    }
                }
                sys.shell = Some(shell);
            }
            _ => {
                check_system_value(key, value, &p)?;
                sys.other.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(sys)
}

/// The RFC 26 dependency schemes a job may name in `attributes.system.dependencies`: Flux's `after` (once the job
/// named has started), `afterany`, `afterok`, `afternotok`, `afterexcept` (once it has ended: any way, successfully,
/// not successfully, with a fatal exception), `begin-time` (not before a time, seconds since the epoch) and
/// `singleton` (after every earlier active job of the same user and name has ended).
pub const DEPENDENCY_SCHEMES: &[&str] =
    &["after", "afterany", "afterok", "afternotok", "afterexcept", "begin-time", "singleton"];

/// The types RFC 14 gives the other `attributes.system` keys it names (kept verbatim in [`System::other`]):
/// `queue`, `bank`, `project` strings; `preemptible-after` a number of seconds `>= 0`; `job` a mapping of strings;
/// `files` a mapping (RFC 37); `constraints` a mapping (RFC 31; its operators are checked by
/// [`Jobspec::validate`]); `dependencies` a list of RFC 26 dependency objects (`{scheme, value}` strings, other
/// keys allowed). Keys RFC 14 does not name pass unchecked.
fn check_system_value(key: &str, value: &Value, p: &str) -> Result<(), JobspecError> {
    match key {
        "queue" | "bank" | "project" => {
            as_string(value, p)?;
        }
        "preemptible-after" => {
            value
                .as_f64()
                .filter(|d| d.is_finite() && *d >= 0.0)
                .ok_or_else(|| invalid(p, "must be a number of seconds >= 0"))?;
        }
        "job" => {
            for (name, val) in as_object(value, p)? {
                let s = as_string(val, &format!("{p}.{name}"))?;
                // The job's name is shown in `vigil jobs` and matched by `vigil jobs --name`: one line of text.
                if name == "name" && (s.trim().is_empty() || s.chars().any(char::is_control)) {
                    return Err(invalid(
                        format!("{p}.name"),
                        "must be a non-blank string without control characters (a newline, a tab)",
                    ));
                }
            }
        }
        "files" => {
            as_object(value, p)?;
        }
        "constraints" => {
            value.as_object().ok_or_else(|| invalid(p, "must be a mapping of constraint operators (RFC 31)"))?;
        }
        "dependencies" => {
            let list = value
                .as_array()
                .ok_or_else(|| invalid(p, "must be a list of dependencies (RFC 26: {scheme, value})"))?;
            for (i, dep) in list.iter().enumerate() {
                let dp = format!("{p}[{i}]");
                let obj = dep.as_object().ok_or_else(|| invalid(&dp, "must be a mapping {scheme, value} (RFC 26)"))?;
                let scheme = match obj.get("scheme") {
                    Some(Value::String(s)) => s.as_str(),
                    Some(_) => return Err(invalid(format!("{dp}.scheme"), "must be a string")),
                    None => return Err(invalid(format!("{dp}.scheme"), "required string (RFC 26)")),
                };
                match obj.get("value") {
                    Some(Value::String(_)) => {}
                    // Flux gives a begin time as a number of seconds since the epoch.
                    Some(Value::Number(_)) if scheme == "begin-time" => {}
                    Some(_) => return Err(invalid(format!("{dp}.value"), "must be a string")),
                    None => return Err(invalid(format!("{dp}.value"), "required string (RFC 26)")),
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn parse_attributes(v: &Value) -> Result<Attributes, JobspecError> {
    let obj = as_object(v, "attributes")?;
    check_keys(obj, &["system", "user"], "attributes")?;
    let system = obj.get("system").map(parse_system).transpose()?.unwrap_or_default();
    let user = obj.get("user").map(|u| as_object(u, "attributes.user").cloned()).transpose()?.unwrap_or_default();
    Ok(Attributes { system, user })
}

impl Jobspec {
    /// Parse jobspec text: JSON if it starts with `{` (after whitespace),
    /// otherwise YAML. Checks the RFC 14 structure only; call
    /// [`Jobspec::validate`] for the RFC 25 V1 rules.
    ///
    /// # Errors
    /// [`JobspecError::Syntax`] for malformed JSON/YAML;
    /// [`JobspecError::Invalid`] naming the field for unknown keys (e.g.
    /// `foo: unknown key`), missing or mistyped fields.
    pub fn parse(text: &str) -> Result<Jobspec, JobspecError> {
        let value: Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| JobspecError::Syntax(format!("JSON: {e}")))?
        } else {
            serde_yaml::from_str(text).map_err(|e| JobspecError::Syntax(format!("YAML: {e}")))?
        };
        Jobspec::from_value(&value)
    }

    /// Convert a JSON value to a [`Jobspec`], checking RFC 14 structure.
    ///
    /// Required: `version` (non-negative integer), `resources` (list),
    /// `tasks` (list). Optional: `attributes` with `system` and `user`.
    ///
    /// # Errors
    /// As [`Jobspec::parse`], without `Syntax`.
    pub fn from_value(value: &Value) -> Result<Jobspec, JobspecError> {
        let root = value.as_object().ok_or_else(|| invalid("(root)", "jobspec must be a mapping"))?;
        check_keys(root, &["version", "resources", "tasks", "attributes"], "")?;
        let version = match root.get("version") {
            None => return Err(invalid("version", "required")),
            Some(v) => v.as_u64().ok_or_else(|| invalid("version", format!("must be 1, got {v}")))?,
        };
        let resources = match root.get("resources") {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, r)| parse_resource(r, &format!("resources[{i}]")))
                .collect::<Result<_, _>>()?,
            _ => return Err(invalid("resources", "required list of resources")),
        };
        let tasks = match root.get("tasks") {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, t)| parse_task(t, &format!("tasks[{i}]")))
                .collect::<Result<_, _>>()?,
            _ => return Err(invalid("tasks", "required list of tasks")),
        };
        let attributes = root.get("attributes").map(parse_attributes).transpose()?.unwrap_or_default();
        Ok(Jobspec { version, resources, tasks, attributes })
    }
}

impl<'de> Deserialize<'de> for Jobspec {
    /// Deserialize with the structural checks of [`Jobspec::from_value`].
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(deserializer)?;
        Jobspec::from_value(&v).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Jobspec {
    type Err = JobspecError;
    /// Same as [`Jobspec::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Jobspec::parse(s)
    }
}
