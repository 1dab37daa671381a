//! Observation encoders: text (and numeric features) to a fixed-size `f32` vector.
//!
//! [`HashedTextEncoder`] is the feature-hashing trick with sign hashing (Weinberger et al.
//! 2009): every unigram and bigram token is hashed (FNV-1a 64 with a seed, then a
//! SplitMix64 finaliser) to a bucket in `0..text_dim` and a sign in `{-1, +1}`; bucket
//! values are summed counts, then L2-normalised. Numeric features are appended unchanged.
//! The hash is fixed and seeded, never the process-random `std` hasher, so the same input
//! always gives the same vector, across runs and machines. Other encoders plug in through
//! the [`Encoder`] trait.

use serde::{Deserialize, Serialize};

/// Errors of encoding.
#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    /// A configuration value is invalid.
    #[error("encoder config: `{field}` {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// Wrong number of numeric features.
    #[error("encoder: `numeric` has {got} features, expected {expected}")]
    NumericLen {
        /// Expected.
        expected: usize,
        /// Got.
        got: usize,
    },
    /// A numeric feature is NaN or infinite.
    #[error("encoder: `numeric` feature {index} is {value} (non-finite)")]
    NonFinite {
        /// Feature index.
        index: usize,
        /// The value.
        value: f32,
    },
    /// The output buffer has the wrong length.
    #[error("encoder: output buffer has {got} entries, expected {expected}")]
    OutLen {
        /// Expected.
        expected: usize,
        /// Got.
        got: usize,
    },
}

/// One observation: text plus numeric features.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation<'a> {
    /// Free text (terminal output, a file listing, an instruction).
    pub text: &'a str,
    /// Numeric features (counters, flags), appended after the text features.
    pub numeric: &'a [f32],
}

/// Anything that turns an [`Observation`] into a fixed-size vector.
pub trait Encoder {
    /// Output width.
    fn dim(&self) -> usize;

    /// Encode into `out` (`dim()` entries, overwritten).
    fn encode_into(&self, obs: &Observation<'_>, out: &mut [f32]) -> Result<(), EncoderError>;

    /// Encode into a new vector.
    fn encode(&self, obs: &Observation<'_>) -> Result<Vec<f32>, EncoderError> {
        let mut out = vec![0.0; self.dim()];
        self.encode_into(obs, &mut out)?;
        Ok(out)
    }

    /// Encode a batch into one row-major `[B, dim()]` vector.
    fn encode_batch(&self, batch: &[Observation<'_>]) -> Result<Vec<f32>, EncoderError> {
        let d = self.dim();
        let mut out = vec![0.0; batch.len() * d];
        for (o, row) in batch.iter().zip(out.chunks_mut(d.max(1))) {
            self.encode_into(o, row)?;
        }
        Ok(out)
    }
}

/// Configuration of [`HashedTextEncoder`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashedTextConfig {
    /// Buckets for text tokens.
    pub text_dim: usize,
    /// Numeric features appended (exactly this many per observation).
    pub numeric_dim: usize,
    /// Add bigrams of consecutive tokens.
    pub bigrams: bool,
    /// Lower-case ASCII letters before hashing.
    pub lowercase: bool,
    /// Hash seed (different seeds give independent hash functions).
    pub seed: u64,
}

impl Default for HashedTextConfig {
    fn default() -> Self {
        Self {
            text_dim: 1024,
            numeric_dim: 0,
            bigrams: true,
            lowercase: true,
            seed: 0,
        }
    }
}

/// Hashed unigram + bigram features with sign hashing, plus numeric features.
#[derive(Debug, Clone)]
pub struct HashedTextEncoder {
    cfg: HashedTextConfig,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = FNV_OFFSET ^ seed.wrapping_mul(FNV_PRIME);
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // Separator that cannot occur inside a token.
            h ^= 0xff;
            h = h.wrapping_mul(FNV_PRIME);
        }
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    h
}

/// SplitMix64's finaliser: spreads FNV's weak low bits over the whole word.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Tokens: maximal runs of ASCII alphanumerics, non-ASCII characters and `_ - . /` (so
/// paths, flags and versions stay whole).
pub fn tokenize(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')))
        .filter(|t| !t.is_empty())
}

impl HashedTextEncoder {
    /// Check and wrap a configuration.
    pub fn new(cfg: HashedTextConfig) -> Result<Self, EncoderError> {
        if cfg.text_dim == 0 {
            return Err(EncoderError::InvalidConfig {
                field: "text_dim",
                reason: "must be > 0".into(),
            });
        }
        Ok(Self { cfg })
    }

    /// The configuration.
    pub fn config(&self) -> &HashedTextConfig {
        &self.cfg
    }

    /// Bucket and sign of a hashed token (or token pair).
    pub fn bucket(&self, parts: &[&[u8]]) -> (usize, f32) {
        let h = mix(fnv1a(self.cfg.seed, parts));
        let idx = (h % self.cfg.text_dim as u64) as usize;
        let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
        (idx, sign)
    }
}

impl Encoder for HashedTextEncoder {
    fn dim(&self) -> usize {
        self.cfg.text_dim + self.cfg.numeric_dim
    }

    fn encode_into(&self, obs: &Observation<'_>, out: &mut [f32]) -> Result<(), EncoderError> {
        if out.len() != self.dim() {
            return Err(EncoderError::OutLen {
                expected: self.dim(),
                got: out.len(),
            });
        }
        if obs.numeric.len() != self.cfg.numeric_dim {
            return Err(EncoderError::NumericLen {
                expected: self.cfg.numeric_dim,
                got: obs.numeric.len(),
            });
        }
        if let Some(index) = obs.numeric.iter().position(|x| !x.is_finite()) {
            return Err(EncoderError::NonFinite {
                index,
                value: obs.numeric[index],
            });
        }
        out.fill(0.0);
        let (text, numeric) = out.split_at_mut(self.cfg.text_dim);
        let lowered;
        let src = if self.cfg.lowercase {
            lowered = obs.text.to_ascii_lowercase();
            lowered.as_str()
        } else {
            obs.text
        };
        let mut prev: Option<&str> = None;
        for tok in tokenize(src) {
            let (i, s) = self.bucket(&[tok.as_bytes()]);
            text[i] += s;
            if self.cfg.bigrams {
                if let Some(p) = prev {
                    let (i, s) = self.bucket(&[p.as_bytes(), tok.as_bytes()]);
                    text[i] += s;
                }
            }
            prev = Some(tok);
        }
        let norm = text
            .iter()
            .map(|x| f64::from(*x).powi(2))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            for x in text.iter_mut() {
                *x = (f64::from(*x) / norm) as f32;
            }
        }
        numeric.copy_from_slice(obs.numeric);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(bigrams: bool) -> HashedTextEncoder {
        HashedTextEncoder::new(HashedTextConfig {
            text_dim: 4096,
            numeric_dim: 2,
            bigrams,
            lowercase: true,
            seed: 1,
        })
        .unwrap()
    }

    #[test]
    fn tokenizer_keeps_paths_and_flags_whole() {
        let t: Vec<&str> = tokenize("ls -la /etc/passwd: No such file (v1.2)").collect();
        assert_eq!(
            t,
            ["ls", "-la", "/etc/passwd", "No", "such", "file", "v1.2"]
        );
    }

    #[test]
    fn features_are_signed_hashed_counts_normalised() {
        let e = enc(false);
        let v = e
            .encode(&Observation {
                text: "disk disk full",
                numeric: &[3.0, -1.0],
            })
            .unwrap();
        assert_eq!(v.len(), 4098);
        let (i, s) = e.bucket(&[b"disk"]);
        let (j, t) = e.bucket(&[b"full"]);
        assert_ne!(i, j, "pick tokens that do not collide for this hand check");
        // Raw: 2s at i, t at j -> norm sqrt(5).
        let n = 5f32.sqrt();
        assert!((v[i] - 2.0 * s / n).abs() < 1e-6);
        assert!((v[j] - t / n).abs() < 1e-6);
        assert_eq!(v.iter().take(4096).filter(|&&x| x != 0.0).count(), 2);
        assert_eq!(&v[4096..], &[3.0, -1.0]);
    }

    #[test]
    fn bigrams_distinguish_word_order_and_encoding_is_deterministic() {
        let e = enc(true);
        let a = e
            .encode(&Observation {
                text: "permission denied",
                numeric: &[0.0, 0.0],
            })
            .unwrap();
        let b = e
            .encode(&Observation {
                text: "denied permission",
                numeric: &[0.0, 0.0],
            })
            .unwrap();
        assert_ne!(a, b);
        let u = enc(false);
        let a1 = u
            .encode(&Observation {
                text: "permission denied",
                numeric: &[0.0, 0.0],
            })
            .unwrap();
        let b1 = u
            .encode(&Observation {
                text: "denied permission",
                numeric: &[0.0, 0.0],
            })
            .unwrap();
        assert_eq!(a1, b1);
        assert_eq!(
            a,
            enc(true)
                .encode(&Observation {
                    text: "PERMISSION Denied",
                    numeric: &[0.0, 0.0]
                })
                .unwrap()
        );
        // Fixed values: the hash is stable across runs and platforms.
        let (i, s) = e.bucket(&[b"error"]);
        assert_eq!((i, s), e.bucket(&[b"error"]));
        let f = |x: u64| mix(fnv1a(0, &[&x.to_le_bytes()]));
        assert_eq!(f(0), f(0));
        assert_eq!(fnv1a(0, &[b""]), FNV_OFFSET);
    }

    #[test]
    fn signs_are_balanced_and_buckets_spread() {
        let e = HashedTextEncoder::new(HashedTextConfig {
            text_dim: 64,
            numeric_dim: 0,
            bigrams: false,
            lowercase: false,
            seed: 5,
        })
        .unwrap();
        let mut counts = [0usize; 64];
        let mut plus = 0;
        let n = 6400;
        for k in 0..n {
            let tok = format!("tok{k}");
            let (i, s) = e.bucket(&[tok.as_bytes()]);
            counts[i] += 1;
            plus += usize::from(s > 0.0);
        }
        // Binomial(6400, 1/2) sd = 40; Binomial(6400, 1/64) sd ~ 9.9; allow ~5 sd.
        assert!((plus as i64 - 3200).abs() < 200, "{plus}");
        assert!(
            counts.iter().all(|&c| (50..=150).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn bad_inputs_are_named() {
        let e = enc(true);
        let err = e
            .encode(&Observation {
                text: "x",
                numeric: &[1.0],
            })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`numeric`") && err.contains("expected 2"),
            "{err}"
        );
        let err = e
            .encode(&Observation {
                text: "x",
                numeric: &[1.0, f32::NAN],
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("feature 1") && err.contains("NaN"), "{err}");
        assert!(HashedTextEncoder::new(HashedTextConfig {
            text_dim: 0,
            ..Default::default()
        })
        .is_err());
        let empty = e
            .encode(&Observation {
                text: "  ,; ",
                numeric: &[0.0, 0.0],
            })
            .unwrap();
        assert!(empty.iter().all(|&x| x == 0.0));
    }
}
