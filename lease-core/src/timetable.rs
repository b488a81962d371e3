//! When a scheduled job fires: a cron expression in a time zone, a fixed rate aligned to
//! the wall clock, or a fixed delay after the previous run (see [`Schedule`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::InvalidInput;

/// When a [`ScheduledJob`](crate::ScheduledJob) fires.
///
/// A firing of [`Schedule::Cron`] and [`Schedule::FixedRate`] is an instant of the wall
/// clock, the same on every instance (up to their clocks' skew): that instant identifies
/// it, and at most one instance runs it. [`Schedule::FixedDelay`] has no instants: a run
/// starts `delay` after the previous run ended, on whichever instance comes first.
///
/// ```
/// # #[cfg(feature = "cron")] {
/// use lease_core::Schedule;
/// // Spring's @Scheduled(cron = "0 * * * * *"): second 0 of every minute, in UTC.
/// let every_minute = Schedule::cron("0 * * * * *").unwrap();
/// // The usual five fields, in a time zone with daylight-saving time.
/// let nightly = Schedule::cron_in("30 2 * * *", "Europe/Berlin").unwrap();
/// assert!(Schedule::cron("61 * * * * *").is_err());
/// # let _ = (every_minute, nightly);
/// # }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Schedule {
    /// A cron expression: five fields (minute, hour, day of month, month, day of week) or
    /// six with seconds first (Spring's `@Scheduled(cron = ...)`), in a time zone. Local
    /// times that a daylight-saving change skips fire at the first instant after the gap;
    /// local times it repeats fire once.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    Cron(Box<CronSchedule>),
    /// Every `period`, at the multiples of `period` since the Unix epoch (in UTC), so that
    /// every instance fires at the same instants whenever it started.
    FixedRate(Duration),
    /// `delay` after the previous run ended, on any instance (Spring's `fixedDelay`).
    FixedDelay(Duration),
}

/// A parsed cron expression with its time zone: [`Schedule::Cron`].
#[cfg(feature = "cron")]
#[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
#[derive(Clone, Debug)]
pub struct CronSchedule {
    expression: String,
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

#[cfg(feature = "cron")]
impl CronSchedule {
    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone its fields are read in.
    pub fn zone(&self) -> chrono_tz::Tz {
        self.zone
    }
}

impl Schedule {
    /// A cron expression read in UTC. See [`Schedule::Cron`].
    ///
    /// Errors: [`InvalidInput::Cron`] saying what is wrong.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    pub fn cron(expression: &str) -> Result<Schedule, InvalidInput> {
        Self::cron_in(expression, "UTC")
    }

    /// A cron expression read in the IANA time zone `zone` (`Europe/Berlin`, `UTC`).
    ///
    /// Errors: [`InvalidInput::Cron`] for the expression, [`InvalidInput::TimeZone`] for
    /// the zone.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    pub fn cron_in(expression: &str, zone: &str) -> Result<Schedule, InvalidInput> {
        let zone: chrono_tz::Tz = zone
            .parse()
            .map_err(|_| InvalidInput::TimeZone(zone.to_owned()))?;
        let fields = expression.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(InvalidInput::Cron {
                expression: expression.to_owned(),
                reason: format!("{fields} fields"),
            });
        }
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build()
            .parse(expression)
            .map_err(|e| InvalidInput::Cron {
                expression: expression.to_owned(),
                reason: e.to_string(),
            })?;
        let schedule = CronSchedule {
            expression: expression.to_owned(),
            cron,
            zone,
        };
        // An expression that never fires (30 February) is refused now, not at run time.
        let schedule = Schedule::Cron(Box::new(schedule));
        if schedule.next_after(SystemTime::now()).is_none() {
            return Err(InvalidInput::Cron {
                expression: expression.to_owned(),
                reason: "it never fires".into(),
            });
        }
        Ok(schedule)
    }

    /// Every `period` at its multiples since the Unix epoch. See [`Schedule::FixedRate`].
    ///
    /// Errors: [`InvalidInput::Schedule`] for a period under one millisecond.
    pub fn fixed_rate(period: Duration) -> Result<Schedule, InvalidInput> {
        if period < Duration::from_millis(1) {
            return Err(InvalidInput::Schedule(format!(
                "a fixed rate of {period:?}: at least 1 ms"
            )));
        }
        Ok(Schedule::FixedRate(period))
    }

    /// `delay` after the previous run ended. See [`Schedule::FixedDelay`].
    ///
    /// Errors: [`InvalidInput::Schedule`] for a zero delay.
    pub fn fixed_delay(delay: Duration) -> Result<Schedule, InvalidInput> {
        if delay.is_zero() {
            return Err(InvalidInput::Schedule("a fixed delay of zero".into()));
        }
        Ok(Schedule::FixedDelay(delay))
    }

    /// The first firing strictly after `t`, or `None` for [`Schedule::FixedDelay`] (and
    /// for a cron expression that never fires again).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            #[cfg(feature = "cron")]
            Schedule::Cron(c) => {
                let local = chrono::DateTime::<chrono::Utc>::from(t).with_timezone(&c.zone);
                let next = c.cron.find_next_occurrence(&local, false).ok()?;
                Some(SystemTime::from(next.with_timezone(&chrono::Utc)))
            }
            Schedule::FixedRate(period) => {
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let p = period.as_nanos().max(1);
                let next = (since / p + 1).checked_mul(p)?;
                let next = u64::try_from(next).ok()?;
                Some(UNIX_EPOCH + Duration::from_nanos(next))
            }
            Schedule::FixedDelay(_) => None,
        }
    }

    /// The last firing at or before `t`, or `None` for [`Schedule::FixedDelay`] (and for
    /// a cron expression that never fired before `t`).
    pub fn last_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            #[cfg(feature = "cron")]
            Schedule::Cron(c) => {
                let local = chrono::DateTime::<chrono::Utc>::from(t).with_timezone(&c.zone);
                let last = c.cron.find_previous_occurrence(&local, true).ok()?;
                Some(SystemTime::from(last.with_timezone(&chrono::Utc)))
            }
            Schedule::FixedRate(period) => {
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let p = period.as_nanos().max(1);
                let last = u64::try_from((since / p).checked_mul(p)?).ok()?;
                Some(UNIX_EPOCH + Duration::from_nanos(last))
            }
            Schedule::FixedDelay(_) => None,
        }
    }

    /// The smallest distance between two firings that tells them apart in a firing's
    /// slot number: the period of a fixed rate, one second for cron (its finest field).
    pub(crate) fn unit(&self) -> Duration {
        match self {
            #[cfg(feature = "cron")]
            Schedule::Cron(_) => Duration::from_secs(1),
            Schedule::FixedRate(period) | Schedule::FixedDelay(period) => *period,
        }
    }
}

/// Nanoseconds since the Unix epoch of `t` (0 before it).
pub(crate) fn epoch_nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn fixed_rate_fires_at_multiples_of_the_period() {
        let s = Schedule::fixed_rate(Duration::from_secs(20)).unwrap();
        assert_eq!(s.next_after(at(1_000_000_005)), Some(at(1_000_000_020)));
        assert_eq!(s.next_after(at(1_000_000_020)), Some(at(1_000_000_040)));
        assert!(Schedule::fixed_rate(Duration::ZERO).is_err());
        assert!(Schedule::fixed_delay(Duration::ZERO).is_err());
    }

    #[test]
    fn last_firing_at_or_before() {
        let s = Schedule::fixed_rate(Duration::from_secs(20)).unwrap();
        assert_eq!(
            s.last_at_or_before(at(1_000_000_005)),
            Some(at(1_000_000_000))
        );
        assert_eq!(
            s.last_at_or_before(at(1_000_000_020)),
            Some(at(1_000_000_020))
        );
        assert_eq!(
            Schedule::fixed_delay(Duration::from_secs(1))
                .unwrap()
                .last_at_or_before(at(5)),
            None
        );
    }

    #[cfg(feature = "cron")]
    #[test]
    fn cron_last_firing_at_or_before() {
        // 2026-11-26T10:00:05Z
        let t = at(1_795_687_205);
        let minute = Schedule::cron("0 * * * * *").unwrap();
        assert_eq!(minute.last_at_or_before(t), Some(at(1_795_687_200)));
        assert_eq!(
            minute.last_at_or_before(at(1_795_687_200)),
            Some(at(1_795_687_200))
        );
        let nightly = Schedule::cron_in("30 2 * * *", "Europe/Berlin").unwrap();
        // 2026-11-26 02:30 CET = 01:30Z.
        assert_eq!(nightly.last_at_or_before(t), Some(at(1_795_656_600)));
    }

    #[cfg(feature = "cron")]
    #[test]
    fn cron_expressions_from_the_source_documents() {
        // 2026-11-26T10:00:05Z
        let t = at(1_795_687_205);
        let minute = Schedule::cron("0 * * * * *").unwrap();
        assert_eq!(minute.next_after(t), Some(at(1_795_687_260)));
        let twenty = Schedule::cron("*/20 * * * * *").unwrap();
        assert_eq!(twenty.next_after(t), Some(at(1_795_687_220)));
        assert_eq!(
            twenty.next_after(at(1_795_687_220)),
            Some(at(1_795_687_240))
        );
        // Five fields: minutes.
        let five = Schedule::cron("*/5 * * * *").unwrap();
        assert_eq!(five.next_after(t), Some(at(1_795_687_500)));
    }

    #[cfg(feature = "cron")]
    #[test]
    fn cron_errors_are_typed_and_say_what_is_wrong() {
        for bad in [
            "",
            "* * * *",
            "61 * * * * *",
            "0 * * * * * 2030",
            "x * * * *",
        ] {
            match Schedule::cron(bad) {
                Err(InvalidInput::Cron { expression, reason }) => {
                    assert_eq!(expression, bad);
                    assert!(!reason.is_empty());
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let e = Schedule::cron("0 0 30 2 *").unwrap_err();
        assert!(e.to_string().contains("never fires"), "{e}");
        assert!(matches!(
            Schedule::cron_in("0 * * * *", "Mars/Olympus"),
            Err(InvalidInput::TimeZone(z)) if z == "Mars/Olympus"
        ));
    }

    /// Europe/Berlin: 2026-03-29 02:00 local does not exist (clocks go 02:00 -> 03:00);
    /// 2026-10-25 02:30 local happens twice (03:00 -> 02:00).
    #[cfg(feature = "cron")]
    #[test]
    fn daylight_saving_changes_neither_skip_nor_repeat_a_day() {
        let s = Schedule::cron_in("30 2 * * *", "Europe/Berlin").unwrap();
        // 2026-03-28T12:00:00Z
        let before_spring = at(1_774_699_200);
        let first = s.next_after(before_spring).unwrap();
        // 2026-03-29: 02:30 does not exist; the firing is at 03:00 CEST = 01:00Z.
        assert_eq!(first, at(1_774_746_000), "spring forward");
        let second = s.next_after(first).unwrap();
        // 2026-03-30 02:30 CEST = 00:30Z.
        assert_eq!(second, at(1_774_830_600));
        // 2026-10-24T12:00:00Z
        let before_autumn = at(1_792_843_200);
        let one = s.next_after(before_autumn).unwrap();
        // 2026-10-25 02:30 happens at 00:30Z (CEST) and 01:30Z (CET): once.
        let two = s.next_after(one).unwrap();
        assert!(
            two.duration_since(one).unwrap() >= Duration::from_secs(23 * 3600),
            "fired twice on the day clocks go back: {one:?} then {two:?}"
        );
    }
}
