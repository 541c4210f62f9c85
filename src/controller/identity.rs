//! Who this replica is and what time it thinks it is (docs/design.md section 2 "Lease",
//! docs/behaviours.md 27).
//!
//! A [`HolderId`] is the controller's name (`--holder-id`, default the hostname) plus a random
//! suffix drawn once per process: two replicas never share one, and a restarted process never
//! reuses its old one. A [`Clock`] is this replica's wall clock, shifted by the hidden test-only
//! `--clock-offset-ms` (compiled with the `fault-injection` feature) so the clock-skew scenarios
//! can skew one replica. It stamps what people read (renewTime, event times); no lease decision
//! reads it: expiry is judged on the monotonic clock (docs/design.md section 4, `controller::lease`).

use std::fmt;

use crate::api::Time;

/// The identity this process holds leases under: `<prefix>-<random suffix>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderId(String);

impl HolderId {
    /// `prefix` plus a fresh random suffix (8 lowercase hex digits).
    pub fn with_random_suffix(prefix: &str) -> HolderId {
        let suffix: u32 = rand::random();
        HolderId(format!("{prefix}-{suffix:08x}"))
    }

    /// The identity as written in `spec.holderIdentity` and `status.lease.holder`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The default holder prefix: the hostname, else `agentrt`.
pub fn default_prefix() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        if let Ok(name) = std::str::from_utf8(&buf[..len]) {
            let name = name.trim();
            if !name.is_empty() {
                return name.to_string();
            }
        }
    }
    "agentrt".to_string()
}

/// This replica's wall clock, shifted by a fixed offset (0 outside tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    offset_ms: i64,
}

impl Clock {
    /// A clock `offset_ms` milliseconds ahead of the system clock (behind when negative).
    pub fn with_offset_ms(offset_ms: i64) -> Clock {
        Clock { offset_ms }
    }

    /// Now, by this replica's clock, to the millisecond ([`Time`]'s precision).
    pub fn now(&self) -> Time {
        Time::from_millis(
            jiff::Timestamp::now()
                .as_millisecond()
                .saturating_add(self.offset_ms),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_identity_is_the_prefix_plus_a_suffix_drawn_per_process() {
        let a = HolderId::with_random_suffix("agentrt");
        let b = HolderId::with_random_suffix("agentrt");
        assert!(a.as_str().starts_with("agentrt-"));
        assert_eq!(a.as_str().len(), "agentrt-".len() + 8);
        assert_ne!(a, b);
    }

    #[test]
    fn a_clock_offset_shifts_now() {
        let ahead = Clock::with_offset_ms(60_000).now().as_millis();
        let real = Clock::default().now().as_millis();
        assert!((ahead - real - 60_000).abs() < 1_000);
    }
}
