//! `vigil update`: change a job's duration, name or urgency.

use crate::cli::connect;
use crate::jobs::JobId;
use clap::Args;
use serde_json::{json, Value};

/// Options of `vigil update`.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// Job id (f58 or decimal).
    pub id: String,
    /// What to change, KEY=VALUE: `duration` (an RFC 23 duration such as 30m, or seconds; `+10m` and `-10m` change
    /// the current limit; 0 or inf for none), `name`, `urgency` (0 to 31, hold, default, expedite).
    #[arg(required = true, value_name = "KEY=VALUE")]
    pub updates: Vec<String>,
}

/// `vigil update`: every change checked by the job manager at once (all or nothing); silent when it is done.
pub(crate) async fn update(a: UpdateArgs) -> Result<i32, String> {
    let id = JobId::parse(&a.id).map_err(|e| e.to_string())?;
    let mut updates = serde_json::Map::new();
    for kv in &a.updates {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("{kv}: expected KEY=VALUE (e.g. duration=30m)"))?;
        if updates.insert(k.to_string(), Value::String(v.to_string())).is_some() {
            return Err(format!("{kv}: {k} is given twice"));
        }
    }
    let c = connect().await?;
    c.rpc("job-manager.update", 0, &json!({"id": id.0, "updates": updates}))
        .await
        .map_err(|e| format!("update {}: {}", a.id, super::as_typed(e.errstr, &a.id)))?;
    Ok(0)
}
