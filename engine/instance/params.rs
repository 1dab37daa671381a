//! Perturbation parameters: values by name, and typed access once they are checked.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A parameter value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Str(s) => f.write_str(s),
        }
    }
}

impl Value {
    /// Parse a command-line value: integer, float, bool, else string.
    pub fn parse(s: &str) -> Self {
        if let Ok(i) = s.parse::<i64>() {
            Self::Int(i)
        } else if let Ok(x) = s.parse::<f64>() {
            Self::Float(x)
        } else if s == "true" || s == "false" {
            Self::Bool(s == "true")
        } else {
            Self::Str(s.to_string())
        }
    }
}

/// Parameters by name (sorted, so plans hash deterministically).
pub type Params = BTreeMap<String, Value>;

/// Typed access to checked parameters (after the perturbation catalogue's `Info::check`, every
/// parameter is present with its declared type).
pub trait ParamsExt {
    fn int(&self, name: &str) -> i64;
    fn float(&self, name: &str) -> f64;
    fn str(&self, name: &str) -> &str;
    fn flag(&self, name: &str) -> bool;
}

impl ParamsExt for Params {
    fn int(&self, name: &str) -> i64 {
        match self.get(name) {
            Some(Value::Int(i)) => *i,
            Some(Value::Float(x)) => *x as i64,
            _ => 0,
        }
    }
    fn float(&self, name: &str) -> f64 {
        match self.get(name) {
            Some(Value::Float(x)) => *x,
            Some(Value::Int(i)) => *i as f64,
            _ => 0.0,
        }
    }
    fn str(&self, name: &str) -> &str {
        match self.get(name) {
            Some(Value::Str(s)) => s,
            _ => "",
        }
    }
    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some(Value::Bool(true)))
    }
}
