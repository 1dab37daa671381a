//! Who may connect: loopback by default; any other address only with a bearer token, which
//! every request (HTTP and the WebSocket upgrade) must then carry as `Authorization: Bearer
//! TOKEN`.

use super::ServeError;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

/// Shortest accepted token.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Read a token file: one line, at least [`MIN_TOKEN_CHARS`] printable characters, and not
/// readable by group or others.
pub fn read_token(file: &Path) -> Result<String, ServeError> {
    let bad = |reason: String| ServeError::Token {
        file: file.into(),
        reason,
    };
    let meta = std::fs::metadata(file).map_err(|e| bad(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!(
            "readable by group or others (mode {:o}): chmod 600 it",
            meta.permissions().mode() & 0o777
        )));
    }
    let text = crate::text::read_input(file).map_err(|e| bad(e.to_string()))?;
    let token = text.trim();
    if token.chars().count() < MIN_TOKEN_CHARS {
        return Err(bad(format!("shorter than {MIN_TOKEN_CHARS} characters")));
    }
    if token.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("contains whitespace or control characters".into()));
    }
    Ok(token.to_string())
}

/// Refuse a non-loopback address without a token.
pub fn check_bind(addr: &SocketAddr, token: Option<&str>) -> Result<(), ServeError> {
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(ServeError::NeedsToken { addr: *addr });
    }
    Ok(())
}

/// Equal in time independent of where the strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware: 401 unless the request carries the token.
pub async fn require(State(token): State<Arc<str>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if same(t.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(serde_json::json!({"detail": "missing or wrong bearer token"})),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }

    #[test]
    fn non_loopback_needs_a_token() {
        let any: SocketAddr = "0.0.0.0:8000".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        assert!(check_bind(&any, None).is_err());
        assert!(check_bind(&any, Some("t")).is_ok());
        assert!(check_bind(&lo, None).is_ok());
    }
}
