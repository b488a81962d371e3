//! Reading the server's replies, and the durations sent to it in milliseconds.

use super::*;

/// The results of a renew script's reply for `n` leases: 1 renewed, 0 lost, 2 lost
/// because the key is not there (`None`: on a cluster the key may have moved).
pub(crate) fn renew_replies(
    operation: &'static str,
    reply: Value,
    n: usize,
) -> Result<Vec<Option<RenewOutcome>>> {
    let items = array(operation, reply)?;
    if items.len() != n {
        return Err(unexpected(
            operation,
            format!("{} results for {n} leases", items.len()),
        ));
    }
    items
        .iter()
        .map(|v| match int(operation, "result", v)? {
            1 => Ok(Some(RenewOutcome::Renewed)),
            0 => Ok(Some(RenewOutcome::Lost)),
            2 => Ok(None),
            other => Err(unexpected(operation, format!("result {other}"))),
        })
        .collect()
}

/// [`renew_replies`] where a missing key is lost (one server, or a call that declared
/// the key: the server would have redirected it if the key had moved).
pub(crate) fn renew_results(
    operation: &'static str,
    reply: Value,
    n: usize,
) -> Result<Vec<RenewOutcome>> {
    Ok(renew_replies(operation, reply, n)?
        .into_iter()
        .map(|r| r.unwrap_or(RenewOutcome::Lost))
        .collect())
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

pub(crate) fn int(operation: &'static str, what: &str, v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected(operation, format!("{what} is not an integer"))),
        other => Err(unexpected(
            operation,
            format!("{what}: expected an integer, got {other:?}"),
        )),
    }
}

pub(crate) fn non_negative(operation: &'static str, what: &str, v: &Value) -> Result<u64> {
    u64::try_from(int(operation, what, v)?)
        .map_err(|_| unexpected(operation, format!("negative {what}")))
}

pub(crate) fn array(operation: &'static str, v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(unexpected(
            operation,
            format!("expected an array, got {other:?}"),
        )),
    }
}

/// A PTTL reply as a remaining time: `None` for "no expiry" (-1) or "no key" (-2).
pub(crate) fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// A duration in whole milliseconds, rounded up, at least 1 ms; rejects more than
/// [`MAX_TTL`].
pub(crate) fn ttl_millis(
    what: &'static str,
    d: Duration,
) -> std::result::Result<u64, InvalidInput> {
    if d > MAX_TTL {
        return Err(InvalidInput::TooLarge {
            what,
            value: d,
            max: MAX_TTL,
        });
    }
    let ms = d.as_nanos().div_ceil(1_000_000).max(1);
    u64::try_from(ms).map_err(|_| InvalidInput::TooLarge {
        what,
        value: d,
        max: MAX_TTL,
    })
}

/// `keep_for` in whole milliseconds, rounded up; zero stays zero.
pub(crate) fn keep_millis(d: Duration) -> std::result::Result<u64, InvalidInput> {
    if d.is_zero() {
        Ok(0)
    } else {
        ttl_millis("keep_for", d)
    }
}
