//! Parsing of sizes (`256M`) and durations (`10s`) as users write them.

/// Errors of unit parsing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("{0:?} is not a size: write a number with an optional K, M, G or T suffix (powers of 1024), e.g. 256M")]
    Size(String),
    #[error("{0:?} is not a duration: write a number with ms, s, m or h, e.g. 10s or 500ms")]
    Duration(String),
}

/// `4096`, `64k`, `256M`, `1G`, `1T` (binary multiples).
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
    let v: f64 = num.parse().map_err(|_| UnitError::Size(s.into()))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(UnitError::Size(s.into()));
    }
    Ok((v * mult as f64) as u64)
}

/// `500ms`, `10s`, `2m`, `1h`; a bare number is seconds.
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

pub fn parse_duration(s: &str) -> Result<std::time::Duration, UnitError> {
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
    if !(secs.is_finite() && secs > 0.0) {
        return Err(UnitError::Duration(s.into()));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
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
    fn sizes_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(64 << 20), "64.0 MiB");
        assert_eq!(format_size(3 << 30), "3.0 GiB");
    }
}
