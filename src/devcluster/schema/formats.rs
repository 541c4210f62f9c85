//! The string `format`s kube-apiserver checks in CRD schemas (go-openapi's strfmt registry):
//! `date-time`, `date`, `byte`, `uuid`, `ipv4`, ... Each check follows strfmt's rule, closely for
//! the common ones (date-time, date, byte, uuid, ip, cidr) and by a regex approximation for the
//! rest (uri, email, hostname, duration, quantity).

use std::net::IpAddr;
use std::sync::LazyLock;

use base64::Engine as _;
use regex::Regex;

/// A constant pattern; were one ever not to compile, its format would accept nothing.
fn re(pattern: &str) -> Option<Regex> {
    Regex::new(pattern).ok()
}

type Pattern = LazyLock<Option<Regex>>;

fn matches(pattern: &Pattern, s: &str) -> bool {
    pattern.as_ref().is_some_and(|re| re.is_match(s))
}

static TIME: Pattern = LazyLock::new(|| {
    re(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
});
static DATE: Pattern = LazyLock::new(|| re(r"^\d{4}-\d{2}-\d{2}$"));
static UUID: Pattern =
    LazyLock::new(|| re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"));
static UUID3: Pattern = LazyLock::new(|| {
    re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID4: Pattern = LazyLock::new(|| {
    re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static UUID5: Pattern = LazyLock::new(|| {
    re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static HOSTNAME: Pattern = LazyLock::new(|| {
    re(
        r"^([a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?)(\.[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?)*\.?$",
    )
});
static EMAIL: Pattern =
    LazyLock::new(|| re(r"^([^<>@\s]+@[^<>@\s]+|[^<>]*<[^<>@\s]+@[^<>@\s]+>)$"));
static URI: Pattern = LazyLock::new(|| re(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|/)\S*$"));
static MAC: Pattern = LazyLock::new(|| {
    re(
        r"(?i)^([0-9a-f]{2}([:-])[0-9a-f]{2}(([:-])[0-9a-f]{2}){4}((([:-])[0-9a-f]{2}){2}|(([:-])[0-9a-f]{2}){14})?|[0-9a-f]{4}(\.[0-9a-f]{4}){2,9})$",
    )
});
static SSN: Pattern = LazyLock::new(|| re(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$"));
static HEXCOLOR: Pattern = LazyLock::new(|| re(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"));
static RGBCOLOR: Pattern = LazyLock::new(|| {
    let c = r"\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*";
    re(&format!(r"^rgb\({c},{c},{c}\)$"))
});
static BSON: Pattern = LazyLock::new(|| re(r"^[0-9a-fA-F]{24}$"));
static DURATION: Pattern = LazyLock::new(|| {
    re(
        r"^([-+]?(\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$|^0$|^\d+\s*(ns|us|µs|ms|s|m|h|d|w|nanoseconds?|microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?|sec|secs|min|mins|hr|hrs)$",
    )
});
static QUANTITY: Pattern = LazyLock::new(|| {
    re(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
});

/// Whether `s` is a valid value of `format` (as written in the schema). Unknown formats pass.
pub(super) fn valid(format: &str, s: &str) -> bool {
    match format.replace('-', "").as_str() {
        "datetime" => is_date_time(s),
        "date" => is_date(s),
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "uuid" => matches(&UUID, s),
        "uuid3" => matches(&UUID3, s),
        "uuid4" => matches(&UUID4, s),
        "uuid5" => matches(&UUID5, s),
        "ipv4" => s.parse::<IpAddr>().is_ok() && s.contains('.'),
        "ipv6" => s.parse::<IpAddr>().is_ok() && s.contains(':'),
        "cidr" => is_cidr(s),
        "hostname" => s.len() <= 255 && matches(&HOSTNAME, s),
        "email" => matches(&EMAIL, s),
        "uri" => matches(&URI, s),
        "mac" => matches(&MAC, s),
        "ssn" => matches(&SSN, s),
        "hexcolor" => matches(&HEXCOLOR, s),
        "rgbcolor" => matches(&RGBCOLOR, s),
        "bsonobjectid" => matches(&BSON, s),
        "duration" => matches(&DURATION, s.trim()),
        "quantity" => matches(&QUANTITY, s),
        "isbn" => is_isbn10(s) || is_isbn13(s),
        "isbn10" => is_isbn10(s),
        "isbn13" => is_isbn13(s),
        "creditcard" => is_credit_card(s),
        _ => true,
    }
}

/// strfmt.IsDate: Go's `time.Parse("2006-01-02", s)`.
fn is_date(s: &str) -> bool {
    matches(&DATE, s) && s.parse::<jiff::civil::Date>().is_ok()
}

/// strfmt.IsDateTime: a date, a `t`, and `hh:mm:ss[.frac](z|±hh:mm)`, case-insensitively.
fn is_date_time(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let lower = s.to_lowercase();
    let parts: Vec<&str> = lower.split('t').collect();
    if parts.len() < 2 || !is_date(parts[0]) {
        return false;
    }
    let Some(caps) = TIME.as_ref().and_then(|re| re.captures(parts[1])) else {
        return false;
    };
    let field = |i: usize| caps.get(i).map_or("", |m| m.as_str());
    field(1) <= "23" && field(2) <= "59" && field(3) <= "59"
}

fn is_cidr(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    !bits.is_empty()
        && bits.len() <= 3
        && bits.chars().all(|c| c.is_ascii_digit())
        && bits.parse::<u32>().is_ok_and(|b| b <= max)
}

fn digits_of(s: &str) -> Vec<u32> {
    s.chars()
        .filter(|c| *c != '-' && *c != ' ')
        .map(|c| c.to_digit(10).unwrap_or(99))
        .collect()
}

fn is_isbn10(s: &str) -> bool {
    let chars: Vec<char> = s.chars().filter(|c| *c != '-' && *c != ' ').collect();
    if chars.len() != 10 {
        return false;
    }
    let mut sum = 0;
    for (i, c) in chars.iter().enumerate() {
        let d = match c.to_digit(10) {
            Some(d) => d,
            None if i == 9 && (*c == 'X' || *c == 'x') => 10,
            None => return false,
        };
        sum += (10 - i as u32) * d;
    }
    sum.is_multiple_of(11)
}

fn is_isbn13(s: &str) -> bool {
    let digits = digits_of(s);
    if digits.len() != 13 || digits.iter().any(|d| *d > 9) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .enumerate()
        .map(|(i, d)| if i % 2 == 0 { *d } else { d * 3 })
        .sum();
    sum.is_multiple_of(10)
}

fn is_credit_card(s: &str) -> bool {
    let digits: Vec<u32> = s.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                *d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::valid;

    #[test]
    fn date_time_follows_strfmt() {
        assert!(valid("date-time", "2024-05-01T10:00:00Z"));
        assert!(valid("date-time", "2024-05-01t10:00:00.123+02:00"));
        assert!(!valid("date-time", "2024-05-01 10:00:00Z"));
        assert!(!valid("date-time", "2024-13-01T10:00:00Z"));
        assert!(!valid("date-time", "yesterday"));
    }

    #[test]
    fn common_formats_accept_and_refuse() {
        assert!(valid("uuid", "123e4567-e89b-12d3-a456-426614174000"));
        assert!(!valid("uuid", "123"));
        assert!(valid("byte", "aGVsbG8="));
        assert!(!valid("byte", "not base64!"));
        assert!(valid("ipv4", "10.0.0.1"));
        assert!(!valid("ipv4", "::1"));
        assert!(valid("cidr", "10.0.0.0/8"));
        assert!(!valid("cidr", "10.0.0.0/33"));
        assert!(valid("date", "2024-02-29"));
        assert!(!valid("date", "2023-02-29"));
        assert!(valid("unknown-format", "anything"));
    }
}
