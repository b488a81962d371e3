//! What the table mode's statements answer, decoded (the acquire row, single columns),
//! and the durations they take, in milliseconds.

use super::*;

/// Outcome row of the acquire statement: whether this statement took the lease, the
/// row's fencing token, holder label and remaining time in microseconds.
pub(crate) type AcquireRow = (bool, i64, Option<String>, i64);

/// The outcome of an acquire from its row.
pub(crate) fn acquire_outcome(
    name: &LeaseName,
    ttl_ms: i64,
    row: AcquireRow,
) -> Result<AcquireOutcome> {
    match row {
        (true, fencing, _, _) => {
            let fencing = u64::try_from(fencing).map_err(|_| {
                Error::unexpected(BACKEND, format!("negative fencing token {fencing}"))
            })?;
            tracing::debug!(lease = %name, fencing, "acquired");
            Ok(AcquireOutcome::Acquired {
                fencing: FencingToken(fencing),
                ttl: Duration::from_millis(ttl_ms.unsigned_abs()),
            })
        }
        (false, _, holder, remaining_us) => {
            tracing::debug!(lease = %name, holder = holder.as_deref(), "held");
            Ok(AcquireOutcome::Held(HeldBy {
                holder,
                // Not positive: it lapsed between the decision and the reply.
                remaining: u64::try_from(remaining_us)
                    .ok()
                    .filter(|us| *us > 0)
                    .map(Duration::from_micros),
            }))
        }
    }
}

/// Column `i` of a row of a simple query, decoded as `T`.
pub(crate) fn column<'r, T>(row: &'r PgRow, i: usize, operation: &'static str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<T, _>(i)
        .map_err(|e| Error::unexpected(BACKEND, format!("{operation}: column {i}: {e}")))
}

/// `d` in milliseconds, rejecting zero TTLs and anything above [`MAX_TTL`].
pub(crate) fn checked_ms(
    what: &'static str,
    d: Duration,
) -> std::result::Result<i64, InvalidInput> {
    if what == "ttl" && d.is_zero() {
        return Err(InvalidInput::TtlZero);
    }
    if d > MAX_TTL {
        return Err(InvalidInput::TooLarge {
            what,
            value: d,
            max: MAX_TTL,
        });
    }
    Ok(millis_ceil(d))
}
