//! The context budget: what of a long conversation a request carries. The system prompt (the
//! task's instruction, the reply format) always goes, cut to half the budget at most; then the
//! most recent turns that fit, newest first, the latest always; the older ones are replaced by
//! one short note saying how many messages were left out. A turn is an assistant reply with
//! the observation (or correction) that answers it, so a tool call never travels without its
//! result. Every message is cut to the per-message cap (head and tail, with a marker); when
//! even the latest turn does not fit, the cap shrinks (to `MIN_CAP` at least): a latest turn
//! still too long at that cap, or with long tool-call arguments (counted, never cut), goes over
//! the budget.
//!
//! The budget counts characters of contents and tool calls (roughly four a token for English
//! and shell output); the JSON framing of a request and the tool definition are not counted.
//! The transcript keeps every message whole; each turn records its [`Window`], from which
//! [`sent`] rebuilds what the request carried.

use super::transcript::{Message, Window};

/// The note's longest text (its count has at most 20 digits).
const NOTE_MAX: usize = 160;
/// The cut marker's longest text.
const MARKER_MAX: usize = 48;
/// The smallest cap a message is cut to when the latest turn does not fit.
const MIN_CAP: usize = 128;

/// The messages a request carries of `messages` (the system prompt first) within `budget`
/// characters, each cut to `cap`, and the record of that choice.
pub fn window(messages: &[Message], budget: usize, cap: usize) -> (Vec<Message>, Window) {
    let Some((system, rest)) = messages.split_first() else {
        return (Vec::new(), Window::default());
    };
    let system = cut_message(system, budget / 2);
    let avail = budget.saturating_sub(system.chars());
    let starts = turn_starts(rest);
    let latest = starts.last().copied().unwrap_or(0);
    let reserve = |keep_from: usize| if keep_from > 0 { NOTE_MAX } else { 0 };
    let cost = |ms: &[Message], cap: usize| -> usize {
        ms.iter().map(|m| cut_message(m, cap).chars()).sum()
    };
    let mut cap = cap;
    let mut keep_from = latest;
    let mut used = cost(&rest[latest..], cap);
    if used + reserve(latest) > avail {
        // Only the latest turn, its messages cut further.
        let n = rest.len().saturating_sub(latest).max(1);
        let left = avail.saturating_sub(reserve(latest));
        cap = cap.min((left / n).max(MIN_CAP));
    } else {
        for pair in starts.windows(2).rev() {
            let (from, to) = (pair[0], pair[1]);
            let c = cost(&rest[from..to], cap);
            if used + c + reserve(from) > avail {
                break;
            }
            used += c;
            keep_from = from;
        }
    }
    let w = Window {
        history: messages.len(),
        elided: keep_from,
        cap,
        chars: 0,
    };
    let out = assemble(system, rest, &w);
    let chars = out.iter().map(Message::chars).sum();
    (out, Window { chars, ..w })
}

/// The messages a request carried, rebuilt from the transcript's `messages` and the turn's
/// [`Window`] (the budget it was built with gives the system prompt's cut).
pub fn sent(messages: &[Message], w: &Window, budget: usize) -> Vec<Message> {
    let history = &messages[..w.history.min(messages.len())];
    let Some((system, rest)) = history.split_first() else {
        return Vec::new();
    };
    assemble(cut_message(system, budget / 2), rest, w)
}

fn assemble(system: Message, rest: &[Message], w: &Window) -> Vec<Message> {
    let mut out = vec![system];
    if w.elided > 0 {
        out.push(Message::new("user", note(rest, w.elided)));
    }
    out.extend(rest.iter().skip(w.elided).map(|m| cut_message(m, w.cap)));
    out
}

/// Where each turn of the conversation after the system prompt begins: at the first message
/// (the first observation) and at every assistant reply.
fn turn_starts(rest: &[Message]) -> Vec<usize> {
    let mut starts: Vec<usize> = rest
        .iter()
        .enumerate()
        .filter(|(i, m)| *i == 0 || m.role == "assistant")
        .map(|(i, _)| i)
        .collect();
    if starts.is_empty() {
        starts.push(0);
    }
    starts
}

/// The note standing for the first `elided` messages after the system prompt.
fn note(rest: &[Message], elided: usize) -> String {
    let commands = rest[..elided.min(rest.len())]
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    format!(
        "[{elided} earlier messages ({commands} of your replies and what they got) are left \
         out to fit the context budget; the task is in the system message.]"
    )
}

fn cut_message(m: &Message, cap: usize) -> Message {
    let mut m = m.clone();
    m.content = cut_middle(&m.content, cap);
    m
}

/// `s` within `max` characters: when longer, its head and tail around a marker saying how
/// many characters were cut from the middle.
pub fn cut_middle(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let keep = max.saturating_sub(MARKER_MAX);
    let head = keep - keep / 3;
    let tail = keep / 3;
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(n - tail).collect();
    format!(
        "{start}\n[... {} characters cut ...]\n{end}",
        n - head - tail
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn talk(turns: usize, each: usize) -> Vec<Message> {
        let mut m = vec![Message::new("system", "S".repeat(100))];
        m.push(Message::new("user", "o".repeat(each)));
        for i in 0..turns {
            m.push(Message::new("assistant", format!("reply {i}")));
            m.push(Message::new("user", format!("{i}:{}", "o".repeat(each))));
        }
        m
    }

    #[test]
    fn a_short_talk_goes_whole() {
        let m = talk(3, 50);
        let (out, w) = window(&m, 10_000, 1000);
        assert_eq!(out, m);
        assert_eq!((w.elided, w.history), (0, m.len()));
        assert_eq!(w.chars, m.iter().map(Message::chars).sum::<usize>());
    }

    #[test]
    fn old_turns_give_way_to_one_note_and_the_latest_stays() {
        let m = talk(40, 300);
        let (out, w) = window(&m, 4096, 1000);
        assert!(w.chars <= 4096, "{w:?}");
        assert!(w.elided > 0 && w.elided % 2 == 1, "whole turns: {w:?}");
        assert_eq!(out[0], m[0]);
        assert!(out[1]
            .content
            .contains(&format!("[{} earlier messages", w.elided)));
        assert_eq!(out.last(), m.last());
        assert_eq!(out[2].role, "assistant");
        assert_eq!(sent(&m, &w, 4096), out);
    }

    #[test]
    fn a_latest_turn_over_the_budget_is_cut_not_dropped() {
        let m = talk(2, 20_000);
        let (out, w) = window(&m, 4096, 8000);
        assert!(w.chars <= 4096, "{w:?}");
        assert!(w.cap < 8000);
        let last = out.last().unwrap();
        assert!(last.content.starts_with("1:ooo") && last.content.contains("characters cut"));
        assert_eq!(sent(&m, &w, 4096), out);
    }

    #[test]
    fn cuts_keep_head_and_tail_within_the_cap() {
        assert_eq!(cut_middle("héllo", 10), "héllo");
        let s: String = ('a'..='z').cycle().take(1000).collect();
        let c = cut_middle(&s, 200);
        assert!(c.chars().count() <= 200);
        assert!(c.starts_with("abc") && c.ends_with(&s[s.len() - 10..]));
        assert!(c.contains("characters cut"));
    }
}
