//! [`Time`]: an instant in the record, serialized as RFC 3339 UTC with millisecond precision
//! (`2026-11-30T00:18:29.123Z`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant in the run's record. Millisecond precision, UTC: a time decoded from a finer one,
/// and the engine's `now`, are cut to the millisecond, the precision it is written with, so a
/// record and its write decoded hold the same instants (docs/design.md section 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub jiff::Timestamp);

impl Time {
    /// From milliseconds since the Unix epoch (saturating at jiff's range).
    pub fn from_millis(millis: i64) -> Time {
        Time(jiff::Timestamp::from_millisecond(millis).unwrap_or(jiff::Timestamp::MAX))
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(&self) -> i64 {
        self.0.as_millisecond()
    }

    /// This instant plus `seconds` (saturating).
    pub fn plus_seconds(&self, seconds: i64) -> Time {
        Time::from_millis(
            self.as_millis()
                .saturating_add(seconds.saturating_mul(1000)),
        )
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let truncated =
            jiff::Timestamp::from_millisecond(self.0.as_millisecond()).unwrap_or(self.0);
        write!(f, "{truncated:.3}")
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // Kept at the precision it is written with, so a record decoded and written again
        // holds the same instant as the one decoded from that write.
        text.parse::<jiff::Timestamp>()
            .map(|at| Time::from_millis(at.as_millisecond()))
            .map_err(|err| {
                serde::de::Error::custom(format!("invalid RFC 3339 time {text:?}: {err}"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_kept_to_the_millisecond_it_is_written_with() {
        let fine: Time =
            serde_json::from_value(serde_json::json!("2026-12-04T20:41:11.221987654Z")).unwrap();
        assert_eq!(fine, Time::from_millis(fine.as_millis()));
        assert_eq!(
            serde_json::to_value(fine).unwrap(),
            serde_json::json!("2026-12-04T20:41:11.221Z")
        );
        // Written and read back: the same instant.
        let again: Time = serde_json::from_value(serde_json::to_value(fine).unwrap()).unwrap();
        assert_eq!(again, fine);
    }
}
