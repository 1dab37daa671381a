//! The features a small policy reads: each block of the text observation (instruction,
//! command, stdout, stderr, listing) hashed into its own range, so a few stderr tokens are not
//! swamped by the instruction and a 64-entry listing; then numeric features; then a short
//! action history (the last `k` actions, each a one-hot slot and its exit flags).
//!
//! Layout of a vector of [`FeatureLayout::dim`] entries (docs/environments.md):
//!
//! | range | what |
//! |---|---|
//! | `text_dim` split 2:2:5:5:2 | hashed unigrams+bigrams of instruction, command, stdout, stderr, listing, each L2-normalised |
//! | next [`NUMERIC_FEATURES`] | exit ok, exit failed, timeout, truncated output, step fraction, disk fraction, stdout size (log), listing size (log) |
//! | next `k * (slots + 2)` | for the last `k` actions, most recent first: a one-hot of the catalogue index (the last slot also stands for free text and indices past it), then ok, failed |

use policies::encoder::{
    Encoder, EncoderError, HashedTextConfig, HashedTextEncoder, Observation as EncObs,
};

/// Numeric features after the text blocks.
pub const NUMERIC_FEATURES: usize = 8;

/// The text blocks in order, with their share of `text_dim` in sixteenths.
pub const BLOCKS: [(&str, usize); 5] = [
    ("instruction", 2),
    ("command", 2),
    ("stdout", 5),
    ("stderr", 5),
    ("listing", 2),
];

/// One action of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The catalogue index, capped at the last slot (which free text also takes).
    pub slot: usize,
    pub ok: bool,
}

/// The encoders of the blocks and the sizes of the numeric and history parts.
#[derive(Debug, Clone)]
pub struct FeatureLayout {
    blocks: Vec<(usize, HashedTextEncoder)>,
    text_dim: usize,
    history: usize,
    slots: usize,
}

impl FeatureLayout {
    /// `text_dim` hashed text features (at least 16), `history` past actions of `slots` slots.
    pub fn new(text_dim: usize, history: usize, slots: usize) -> Result<Self, EncoderError> {
        if text_dim < 16 {
            return Err(EncoderError::InvalidConfig {
                field: "feature_dim",
                reason: format!("{text_dim} is below 16 (one range per text block)"),
            });
        }
        if history > 0 && slots == 0 {
            return Err(EncoderError::InvalidConfig {
                field: "history_slots",
                reason: "must be at least 1 when history is kept".into(),
            });
        }
        let mut blocks = Vec::new();
        let mut left = text_dim;
        for (i, (_, share)) in BLOCKS.iter().enumerate() {
            let w = if i + 1 == BLOCKS.len() {
                left
            } else {
                text_dim * share / 16
            };
            left -= w;
            let enc = HashedTextEncoder::new(HashedTextConfig {
                text_dim: w,
                numeric_dim: 0,
                seed: i as u64,
                ..HashedTextConfig::default()
            })?;
            blocks.push((w, enc));
        }
        Ok(Self {
            blocks,
            text_dim,
            history,
            slots,
        })
    }

    /// Width of the whole vector.
    pub fn dim(&self) -> usize {
        self.text_dim + NUMERIC_FEATURES + self.history * (self.slots + 2)
    }

    /// The slot of a catalogue index (free text: `None`).
    pub fn slot(&self, index: Option<usize>) -> usize {
        let last = self.slots.saturating_sub(1);
        index.map_or(last, |i| i.min(last))
    }

    /// How many past actions are kept.
    pub fn history_len(&self) -> usize {
        self.history
    }

    /// Encode the blocks (in [`BLOCKS`] order), the numeric features and the history (most
    /// recent last in `history`; only the last `k` are used).
    pub fn encode(
        &self,
        blocks: [&str; 5],
        numeric: &[f32; NUMERIC_FEATURES],
        history: &[HistoryEntry],
    ) -> Result<Vec<f32>, EncoderError> {
        let mut out = Vec::with_capacity(self.dim());
        for ((w, enc), text) in self.blocks.iter().zip(blocks) {
            let start = out.len();
            out.resize(start + w, 0.0);
            enc.encode_into(&EncObs { text, numeric: &[] }, &mut out[start..])?;
        }
        if let Some(index) = numeric.iter().position(|x| !x.is_finite()) {
            return Err(EncoderError::NonFinite {
                index,
                value: numeric[index],
            });
        }
        out.extend_from_slice(numeric);
        let width = self.slots + 2;
        for k in 0..self.history {
            let start = out.len();
            out.resize(start + width, 0.0);
            if let Some(h) = history.iter().rev().nth(k) {
                out[start + h.slot.min(self.slots - 1)] = 1.0;
                out[start + self.slots + usize::from(!h.ok)] = 1.0;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_their_own_ranges_and_history_is_most_recent_first() {
        let l = FeatureLayout::new(64, 2, 4).unwrap();
        assert_eq!(l.dim(), 64 + NUMERIC_FEATURES + 2 * 6);
        let num = [0.0; NUMERIC_FEATURES];
        let a = l
            .encode(["", "", "", "No such file", ""], &num, &[])
            .unwrap();
        let b = l
            .encode(["", "", "No such file", "", ""], &num, &[])
            .unwrap();
        // stdout is [16, 36), stderr [36, 56) of 64 (shares 2:2:5:5:2).
        assert!(a[36..56].iter().any(|x| *x != 0.0) && a[16..36].iter().all(|x| *x == 0.0));
        assert!(b[16..36].iter().any(|x| *x != 0.0) && b[36..56].iter().all(|x| *x == 0.0));
        // A long instruction does not dilute the stderr range (each block is normalised).
        let long = "archive every log ".repeat(50);
        let c = l
            .encode([&long, "", "", "No such file", ""], &num, &[])
            .unwrap();
        assert_eq!(a[36..56], c[36..56]);
        let h = [
            HistoryEntry { slot: 1, ok: true },
            HistoryEntry { slot: 9, ok: false },
        ];
        let d = l.encode(["", "", "", "", ""], &num, &h).unwrap();
        let hist = &d[64 + NUMERIC_FEATURES..];
        // Most recent first: slot 9 is capped at the last slot (3), failed.
        assert_eq!(&hist[..6], &[0.0, 0.0, 0.0, 1.0, 0.0, 1.0]);
        assert_eq!(&hist[6..], &[0.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
        assert_eq!(l.slot(None), 3);
        assert!(FeatureLayout::new(8, 1, 1).is_err());
        assert!(l.encode(["", "", "", "", ""], &[f32::NAN; 8], &[]).is_err());
    }
}
