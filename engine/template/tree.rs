//! The positioned tree: a TOML or YAML document read into [`Node`]s that remember the line and
//! column of every key and value (TOML through `toml::Spanned`, YAML through `yaml-rust2`'s
//! marked events), so that errors about any value can name where it is written.

use std::collections::BTreeMap;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

/// A value of the document with the position where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub pos: Pos,
    pub value: NodeValue,
}

/// What a node holds: a scalar, a list, or a table.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeValue {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Keys in document order, each with its own position.
    Map(Vec<(String, Pos, Node)>),
}

impl NodeValue {
    /// How an error names what was found ("a list", "a string", ...).
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "a boolean",
            Self::Int(_) => "an integer",
            Self::Float(_) => "a float",
            Self::Str(_) => "a string",
            Self::Seq(_) => "a list",
            Self::Map(_) => "a table",
        }
    }
}

/// Byte offset -> 1-based (line, column in chars), offset clamped: the sandbox crate's helper,
/// the one of the whole workspace.
pub use sandbox::text_pos::line_col;

impl Pos {
    /// The position of a byte offset into `text` ([`line_col`]).
    pub fn at(text: &str, offset: usize) -> Self {
        let (line, col) = line_col(text, offset);
        Self { line, col }
    }
}

// TOML: a self-describing value whose nested keys and values are `toml::Spanned`.
enum Raw {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<toml::Spanned<Raw>>),
    Map(Vec<(toml::Spanned<String>, toml::Spanned<Raw>)>),
}

impl<'de> serde::Deserialize<'de> for Raw {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> serde::de::Visitor<'de> for RawVisitor {
    type Value = Raw;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Raw, E> {
        i64::try_from(v)
            .map(Raw::Int)
            .map_err(|_| E::custom("integer too large"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Raw::Seq(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Raw, A::Error> {
        let mut v = Vec::new();
        while let Some(k) = a.next_key::<toml::Spanned<String>>()? {
            let val = a.next_value::<toml::Spanned<Raw>>()?;
            v.push((k, val));
        }
        Ok(Raw::Map(v))
    }
}

fn raw_to_node(text: &str, raw: Raw, pos: Pos) -> Node {
    let v = match raw {
        Raw::Bool(b) => NodeValue::Bool(b),
        Raw::Int(i) => NodeValue::Int(i),
        Raw::Float(x) => NodeValue::Float(x),
        Raw::Str(s) => NodeValue::Str(s),
        Raw::Seq(items) => NodeValue::Seq(
            items
                .into_iter()
                .map(|s| {
                    let p = Pos::at(text, s.span().start);
                    raw_to_node(text, s.into_inner(), p)
                })
                .collect(),
        ),
        Raw::Map(entries) => NodeValue::Map(
            entries
                .into_iter()
                .map(|(k, val)| {
                    let kp = Pos::at(text, k.span().start);
                    let vp = Pos::at(text, val.span().start);
                    (k.into_inner(), kp, raw_to_node(text, val.into_inner(), vp))
                })
                .collect(),
        ),
    };
    Node { pos, value: v }
}

/// Parse TOML into the positioned tree.
pub fn toml_tree(text: &str) -> Result<Node, (Pos, String)> {
    let raw: Raw = toml::from_str(text).map_err(|e| {
        let pos = e
            .span()
            .map_or(Pos { line: 1, col: 1 }, |s| Pos::at(text, s.start));
        (pos, e.message().trim().to_string())
    })?;
    Ok(raw_to_node(text, raw, Pos { line: 1, col: 1 }))
}

/// The most values a document may hold once its YAML aliases are expanded: a few hundred
/// bytes of nested aliases would otherwise expand to gigabytes before any validation.
pub const MAX_NODES: usize = 100_000;
/// The deepest nesting of lists and tables accepted.
pub const MAX_DEPTH: usize = 64;

// YAML: built from the parser's marked events. Each frame counts the values below it, so an
// alias adds the size of what it repeats to the document's budget before it is copied.
enum Frame {
    Seq(Pos, usize, usize, Vec<Node>),
    Map(
        Pos,
        usize,
        usize,
        Vec<(String, Pos, Node)>,
        Option<(String, Pos)>,
    ),
}

#[derive(Default)]
struct YamlBuilder {
    stack: Vec<Frame>,
    root: Option<Node>,
    /// Anchored values and how many values each holds.
    anchors: BTreeMap<usize, (Node, usize)>,
    /// Values built so far, aliases expanded.
    nodes: usize,
    error: Option<(Pos, String)>,
}

fn yaml_scalar(s: String, style: yaml_rust2::scanner::TScalarStyle) -> NodeValue {
    use yaml_rust2::scanner::TScalarStyle;
    if style != TScalarStyle::Plain {
        return NodeValue::Str(s);
    }
    match s.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return NodeValue::Null,
        "true" | "True" | "TRUE" => return NodeValue::Bool(true),
        "false" | "False" | "FALSE" => return NodeValue::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" => return NodeValue::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return NodeValue::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return NodeValue::Float(f64::NAN),
        _ => {}
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(&s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = s.parse::<i64>() {
            return NodeValue::Int(i);
        }
    }
    if let Some(h) = s.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(h, 16) {
            return NodeValue::Int(i);
        }
    }
    if let Some(o) = s.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(o, 8) {
            return NodeValue::Int(i);
        }
    }
    let float_like = digits.bytes().any(|b| b.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'));
    if float_like {
        if let Ok(x) = s.parse::<f64>() {
            return NodeValue::Float(x);
        }
    }
    NodeValue::Str(s)
}

impl YamlBuilder {
    fn fail(&mut self, pos: Pos, reason: String) {
        if self.error.is_none() {
            self.error = Some((pos, reason));
        }
    }

    /// Add a value of `size` values to the parent frame (or make it the root).
    fn push(&mut self, node: Node, size: usize) {
        self.nodes = self.nodes.saturating_add(size);
        if self.nodes > MAX_NODES {
            return self.fail(
                node.pos,
                format!("the document holds more than {MAX_NODES} values (aliases expanded)"),
            );
        }
        let mut err = None;
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Frame::Seq(_, _, n, items)) => {
                *n += size;
                items.push(node);
            }
            Some(Frame::Map(_, _, n, entries, pending)) => match pending.take() {
                Some((k, kp)) => {
                    *n += size;
                    entries.push((k, kp, node));
                }
                None => {
                    let key = match node.value {
                        NodeValue::Str(s) => s,
                        NodeValue::Int(i) => i.to_string(),
                        NodeValue::Bool(b) => b.to_string(),
                        NodeValue::Float(x) => x.to_string(),
                        NodeValue::Null => "null".into(),
                        NodeValue::Seq(_) | NodeValue::Map(_) => {
                            err = Some((node.pos, "a key must be a plain value".into()));
                            String::new()
                        }
                    };
                    *pending = Some((key, node.pos));
                }
            },
        }
        if let Some((pos, reason)) = err {
            self.fail(pos, reason);
        }
    }

    fn open(&mut self, frame: Frame, pos: Pos) {
        if self.stack.len() >= MAX_DEPTH {
            return self.fail(pos, format!("nested deeper than {MAX_DEPTH} levels"));
        }
        self.stack.push(frame);
    }
}

impl yaml_rust2::parser::MarkedEventReceiver for YamlBuilder {
    fn on_event(&mut self, ev: yaml_rust2::Event, mark: yaml_rust2::scanner::Marker) {
        use yaml_rust2::Event;
        if self.error.is_some() {
            return;
        }
        let pos = Pos {
            line: mark.line(),
            col: mark.col() + 1,
        };
        match ev {
            Event::Scalar(s, style, anchor, _tag) => {
                let node = Node {
                    pos,
                    value: yaml_scalar(s, style),
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, (node.clone(), 1));
                }
                self.push(node, 1);
            }
            Event::SequenceStart(anchor, _) => {
                self.open(Frame::Seq(pos, anchor, 1, Vec::new()), pos);
            }
            Event::MappingStart(anchor, _) => {
                self.open(Frame::Map(pos, anchor, 1, Vec::new(), None), pos);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor, size) = match self.stack.pop() {
                    Some(Frame::Seq(p, a, n, items)) => (
                        Node {
                            pos: p,
                            value: NodeValue::Seq(items),
                        },
                        a,
                        n,
                    ),
                    Some(Frame::Map(p, a, n, entries, _)) => (
                        Node {
                            // A block mapping's start mark is at its first `:`; its first
                            // key is where a reader looks.
                            pos: entries.first().map_or(p, |e| e.1),
                            value: NodeValue::Map(entries),
                        },
                        a,
                        n,
                    ),
                    None => return,
                };
                if anchor > 0 {
                    self.anchors.insert(anchor, (node.clone(), size));
                }
                // Its values were counted as they came; the container itself is one more.
                self.nodes = self.nodes.saturating_sub(size - 1);
                self.push(node, size);
            }
            Event::Alias(id) => match self.anchors.get(&id) {
                // The budget is checked before the copy.
                Some((_, size)) if self.nodes.saturating_add(*size) > MAX_NODES => self.fail(
                    pos,
                    format!("the document holds more than {MAX_NODES} values (aliases expanded)"),
                ),
                Some((n, size)) => {
                    let (n, size) = (n.clone(), *size);
                    self.push(n, size);
                }
                None => self.fail(pos, "alias of an unknown anchor".into()),
            },
            _ => {}
        }
    }
}

/// Parse YAML into the positioned tree (the first document of the stream).
pub fn yaml_tree(text: &str) -> Result<Node, (Pos, String)> {
    let mut b = YamlBuilder::default();
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    parser.load(&mut b, false).map_err(|e| {
        let m = e.marker();
        (
            Pos {
                line: m.line(),
                col: m.col() + 1,
            },
            e.info().to_string(),
        )
    })?;
    if let Some(e) = b.error {
        return Err(e);
    }
    Ok(b.root.unwrap_or(Node {
        pos: Pos { line: 1, col: 1 },
        value: NodeValue::Null,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_scalars_follow_the_core_schema() {
        use yaml_rust2::scanner::TScalarStyle::{DoubleQuoted, Plain};
        assert_eq!(yaml_scalar("12".into(), Plain), NodeValue::Int(12));
        assert_eq!(yaml_scalar("-3".into(), Plain), NodeValue::Int(-3));
        assert_eq!(yaml_scalar("0.25".into(), Plain), NodeValue::Float(0.25));
        assert_eq!(yaml_scalar("1e3".into(), Plain), NodeValue::Float(1000.0));
        assert_eq!(yaml_scalar("true".into(), Plain), NodeValue::Bool(true));
        assert_eq!(yaml_scalar("~".into(), Plain), NodeValue::Null);
        assert_eq!(
            yaml_scalar("64M".into(), Plain),
            NodeValue::Str("64M".into())
        );
        assert_eq!(
            yaml_scalar("12".into(), DoubleQuoted),
            NodeValue::Str("12".into())
        );
        assert_eq!(yaml_scalar("e".into(), Plain), NodeValue::Str("e".into()));
    }

    #[test]
    fn line_col_counts_characters_and_clamps() {
        let text = "ab\ncd";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 2), (1, 3), "the newline itself ends line 1");
        assert_eq!(line_col(text, 3), (2, 1));
        assert_eq!(line_col(text, 99), (2, 3));
        assert_eq!(line_col("", 0), (1, 1));
        // "é" is 2 bytes, "🦀" 4: each is one column; an offset inside one is its start.
        let text = "x = \"é🦀\"\nnext";
        let at = |needle: &str| text.find(needle).unwrap();
        assert_eq!(line_col(text, at("🦀")), (1, 7));
        assert_eq!(line_col(text, at("🦀") + 2), (1, 7));
        assert_eq!(line_col(text, at("\"\n")), (1, 8));
        assert_eq!(line_col(text, at("next")), (2, 1));
    }

    #[test]
    fn toml_and_yaml_trees_position_keys_and_values() {
        let toml = toml_tree("[t]\n  k = [1, \"é\"]\n").unwrap();
        let yaml = yaml_tree("t:\n  k: [1, é]\n").unwrap();
        for (root, key_col, list_col) in [(&toml, 3, 7), (&yaml, 3, 6)] {
            let NodeValue::Map(top) = &root.value else {
                panic!("{root:?}")
            };
            let NodeValue::Map(t) = &top[0].2.value else {
                panic!("{root:?}")
            };
            let (k, kp, list) = &t[0];
            assert_eq!(
                (k.as_str(), *kp),
                (
                    "k",
                    Pos {
                        line: 2,
                        col: key_col
                    }
                )
            );
            assert_eq!(
                list.pos,
                Pos {
                    line: 2,
                    col: list_col
                }
            );
            let NodeValue::Seq(items) = &list.value else {
                panic!("{list:?}")
            };
            assert_eq!(items[1].value, NodeValue::Str("é".into()));
        }
    }
}
