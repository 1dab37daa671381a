//! Parsing of sizes (`256M`) and durations (`10s`) as users write them, range-checked: no
//! value wraps, saturates or panics.
//!
//! Also compiled into the static `engine` front (engine/front/lib.rs), which has this file and
//! `text.rs` alone of the library: use nothing else of the crate here.

use crate::text::cut;
use std::time::Duration;

/// The largest size accepted (1024T): more is a typo, and wraps in the kernel's tmpfs size.
pub const MAX_SIZE: u64 = 1 << 50;
/// The shortest duration accepted: limits are kept in milliseconds, where less is zero.
pub const MIN_DURATION: Duration = Duration::from_millis(1);
/// The longest duration accepted (30 days).
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Errors of unit parsing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("`{}` is not a size: write a number with an optional K, M, G or T suffix (powers of 1024), e.g. 256M", cut(.0))]
    Size(String),
    #[error("`{}` is out of range: a size is at least 1 byte and at most 1024T", cut(.0))]
    SizeRange(String),
    #[error("`{}` is not a duration: write a number with ms, s, m or h, e.g. 10s or 500ms", cut(.0))]
    Duration(String),
    #[error("`{}` is out of range: a duration is at least 1ms and at most 720h (30 days)", cut(.0))]
    DurationRange(String),
}

/// `4096`, `64k`, `256M`, `1G`, `1T` (binary multiples), between 1 byte and [`MAX_SIZE`].
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let (num, mult) = match t
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit() && *c != '.')
    {
        None => (t, 1u64),
        Some((i, _)) => {
            let mult = match t[i..].to_ascii_lowercase().trim_end_matches(['b', 'i']) {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return Err(UnitError::Size(s.into())),
            };
            (&t[..i], mult)
        }
    };
    let range = || UnitError::SizeRange(s.into());
    let bytes = if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| UnitError::Size(s.into()))?;
        let b = v * mult as f64;
        // Digits and one dot parse to a finite, non-negative number; the bound comes first,
        // so the conversion below neither saturates nor wraps.
        if !(b >= 1.0 && b <= MAX_SIZE as f64) {
            return Err(range());
        }
        b as u64
    } else {
        if num.is_empty() {
            return Err(UnitError::Size(s.into()));
        }
        // Only digits: exact integer arithmetic, an overflow is out of range.
        num.parse::<u64>()
            .ok()
            .and_then(|v| v.checked_mul(mult))
            .ok_or_else(range)?
    };
    if !(1..=MAX_SIZE).contains(&bytes) {
        return Err(range());
    }
    Ok(bytes)
}

/// A byte count for people: `512 B`, `1.5 KiB`, `64.0 MiB`, `2.0 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// `500ms`, `10s`, `2m`, `1h`; a bare number is seconds. Between [`MIN_DURATION`] and
/// [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    let split = t
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit() && *c != '.')
        .map_or(t.len(), |(i, _)| i);
    let v: f64 = t[..split]
        .parse()
        .map_err(|_| UnitError::Duration(s.into()))?;
    let secs = match &t[split..] {
        "ms" => v / 1e3,
        "" | "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(UnitError::Duration(s.into())),
    };
    // Digits and a dot parse to a finite, non-negative number (or +inf for 400 digits,
    // which the bound refuses); from_secs_f64 panics only outside the bound.
    if !(secs >= MIN_DURATION.as_secs_f64() && secs <= MAX_DURATION.as_secs_f64()) {
        return Err(UnitError::DurationRange(s.into()));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A float from any input that must be a number: NaN and the infinities are refused.
pub fn finite(x: f64) -> Result<f64, String> {
    if x.is_finite() {
        Ok(x)
    } else {
        Err(format!("{x} is not a finite number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap().as_millis(), 10_000);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("3").unwrap().as_secs(), 3);
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn out_of_range_values_are_errors_not_wraps_or_panics() {
        use UnitError::{DurationRange, SizeRange};
        let max = u64::MAX.to_string();
        assert_eq!(parse_size(&max), Err(SizeRange(max.clone())));
        assert_eq!(parse_size("16777216T"), Err(SizeRange("16777216T".into())));
        assert_eq!(parse_size("1024T"), Ok(MAX_SIZE));
        assert!(matches!(parse_size("1025T"), Err(SizeRange(_))));
        assert!(matches!(parse_size("0.1"), Err(SizeRange(_))));
        assert!(matches!(parse_size("1e3"), Err(UnitError::Size(_))));
        for d in [
            "99999999999999999999s",
            "18446744073709551615s",
            "721h",
            "0.0001s",
            "0",
        ] {
            assert_eq!(parse_duration(d), Err(DurationRange(d.into())), "{d}");
        }
        assert_eq!(parse_duration("720h"), Ok(MAX_DURATION));
        assert_eq!(parse_duration("1ms"), Ok(MIN_DURATION));
        assert!(parse_duration(&"9".repeat(400)).is_err());
        assert_eq!(
            parse_duration("99999999999999999999s").unwrap_err().to_string(),
            "`99999999999999999999s` is out of range: a duration is at least 1ms and at most 720h (30 days)"
        );
        assert!(finite(f64::NAN).is_err() && finite(f64::INFINITY).is_err());
        assert_eq!(finite(-2.5), Ok(-2.5));
    }

    /// Random and boundary strings: every parser answers (a value in range or an error), none
    /// panics.
    #[test]
    fn parsers_never_panic_on_random_or_boundary_input() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
        let atoms = [
            "0",
            "1",
            "9",
            ".",
            "-",
            "+",
            "e",
            "ms",
            "s",
            "m",
            "h",
            "k",
            "M",
            "G",
            "T",
            "iB",
            "b",
            "18446744073709551615",
            "18446744073709551616",
            "1e308",
            "nan",
            "inf",
            " ",
            "\0",
            "é",
            "1.5",
            "00000000000000000000000000000001",
        ];
        for _ in 0..20_000 {
            let n = rng.gen_range(0..6);
            let s: String = (0..n)
                .map(|_| atoms[rng.gen_range(0..atoms.len())])
                .collect();
            if let Ok(b) = parse_size(&s) {
                assert!((1..=MAX_SIZE).contains(&b), "{s:?} -> {b}");
            }
            if let Ok(d) = parse_duration(&s) {
                assert!((MIN_DURATION..=MAX_DURATION).contains(&d), "{s:?} -> {d:?}");
            }
            let _ = format_size(rng.gen());
        }
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(64 << 20), "64.0 MiB");
        assert_eq!(format_size(3 << 30), "3.0 GiB");
    }
}
