//! The server's access configuration: bearer tokens and the actors they stand for, the
//! fronting proxy's headers (trusted only when configured), the session and CSRF settings.
//! Read from JSON (`ops-server --config <file>`), or built in code.

use crate::{Error, Result};
use ops::{Actor, Role};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// Most tokens one configuration may list.
pub const TOKENS_MAX: usize = 1_000;
/// Fewest bytes of a configured token (a token is a password nobody types: make it long).
pub const TOKEN_BYTES_MIN: usize = 16;
/// Most bytes of a token (configured or presented).
pub const TOKEN_BYTES_MAX: usize = 512;
/// Most task roles of one actor.
pub const TASK_ROLES_MAX: usize = 64;
/// Most allowed extra origins.
pub const ORIGINS_MAX: usize = 64;
/// Fewest bytes of a configured server secret.
pub const SECRET_BYTES_MIN: usize = 32;
/// Default session lifetime: 8 hours.
pub const SESSION_TTL_S_DEFAULT: u64 = 8 * 3600;
/// Longest session lifetime: 7 days.
pub const SESSION_TTL_S_MAX: u64 = 7 * 24 * 3600;

/// One configured bearer token and the actor it authenticates.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// The token itself; give this or `token_sha256`.
    #[serde(default)]
    pub token: Option<String>,
    /// The token's SHA-256 in hex, so the file need not hold the token.
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// The actor's name (a K-2.0 identifier; it is what the audit log records).
    pub name: String,
    /// `viewer` or `operator`.
    pub role: Role,
    /// The roles a human-task inbox knows the actor by (K-17.5).
    #[serde(default)]
    pub task_roles: Vec<String>,
}

/// The header names of a fronting proxy that authenticates people itself. Only configured
/// proxies are trusted: without this section the headers are ignored. The proxy must strip
/// these headers from what clients send.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyHeaders {
    /// The header carrying the user's name (e.g. `x-forwarded-user`).
    pub user: String,
    /// The header carrying `viewer` or `operator`; absent or empty means viewer.
    #[serde(default)]
    pub role: Option<String>,
    /// The header carrying the task roles, comma-separated.
    #[serde(default)]
    pub task_roles: Option<String>,
}

/// The access configuration of the server.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Bearer tokens.
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
    /// The fronting proxy's headers, when one authenticates.
    #[serde(default)]
    pub proxy: Option<ProxyHeaders>,
    /// The key of the CSRF tokens (at least [`SECRET_BYTES_MIN`] bytes); a random one per
    /// process when absent (sessions do not outlive the process anyway).
    #[serde(default)]
    pub secret: Option<String>,
    /// Session lifetime in seconds (default [`SESSION_TTL_S_DEFAULT`]).
    #[serde(default)]
    pub session_ttl_s: Option<u64>,
    /// Mark the session cookie `Secure` (serve over HTTPS, or behind a TLS proxy).
    #[serde(default)]
    pub secure_cookie: bool,
    /// Origins besides the request's own host allowed to POST (`https://ops.example.com`).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// The checked configuration: tokens by their digest.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub tokens: HashMap<[u8; 32], Actor>,
    pub proxy: Option<ProxyHeaders>,
    pub secret: Vec<u8>,
    pub session_ttl_s: u64,
    pub secure_cookie: bool,
    pub allowed_origins: Vec<String>,
}

/// The SHA-256 of a token, as the configuration's `token_sha256` holds it.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl ServerConfig {
    /// Parse a JSON configuration.
    ///
    /// # Errors
    /// [`Error::Config`] when it does not parse.
    pub fn from_json(text: &str) -> Result<ServerConfig> {
        serde_json::from_str(text).map_err(|e| Error::Config(format!("configuration: {e}")))
    }

    pub(crate) fn check(&self) -> Result<Access> {
        let bad = |m: String| Err(Error::Config(m));
        if self.tokens.len() > TOKENS_MAX {
            return bad(format!("more than {TOKENS_MAX} tokens"));
        }
        let mut tokens = HashMap::new();
        for (i, t) in self.tokens.iter().enumerate() {
            let digest = match (&t.token, &t.token_sha256) {
                (Some(tok), None) => {
                    if tok.len() < TOKEN_BYTES_MIN || tok.len() > TOKEN_BYTES_MAX {
                        return bad(format!("tokens[{i}]: a token has {TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX} bytes"));
                    }
                    token_digest(tok)
                }
                (None, Some(h)) => {
                    let mut d = [0u8; 32];
                    if hex::decode_to_slice(h, &mut d).is_err() {
                        return bad(format!("tokens[{i}]: token_sha256 is 64 hex digits"));
                    }
                    d
                }
                _ => return bad(format!("tokens[{i}]: give exactly one of token and token_sha256")),
            };
            let actor = checked_actor(&t.name, t.role, t.task_roles.clone())
                .map_err(|m| Error::Config(format!("tokens[{i}]: {m}")))?;
            if tokens.insert(digest, actor).is_some() {
                return bad(format!("tokens[{i}]: the same token is listed twice"));
            }
        }
        if let Some(p) = &self.proxy {
            for h in [Some(&p.user), p.role.as_ref(), p.task_roles.as_ref()].into_iter().flatten() {
                if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                    return bad(format!("proxy: `{h}` is not a header name"));
                }
            }
        }
        let secret = match &self.secret {
            Some(s) if s.len() >= SECRET_BYTES_MIN => s.as_bytes().to_vec(),
            Some(_) => return bad(format!("secret: at least {SECRET_BYTES_MIN} bytes")),
            None => {
                let a = kernel_core::ports::os_task_token().map_err(|e| Error::Config(format!("secret: {e}")))?;
                let b = kernel_core::ports::os_task_token().map_err(|e| Error::Config(format!("secret: {e}")))?;
                format!("{a}{b}").into_bytes()
            }
        };
        let session_ttl_s = self.session_ttl_s.unwrap_or(SESSION_TTL_S_DEFAULT);
        if session_ttl_s == 0 || session_ttl_s > SESSION_TTL_S_MAX {
            return bad(format!("session_ttl_s: 1 to {SESSION_TTL_S_MAX}"));
        }
        if self.allowed_origins.len() > ORIGINS_MAX {
            return bad(format!("more than {ORIGINS_MAX} allowed origins"));
        }
        for o in &self.allowed_origins {
            if !(o.starts_with("http://") || o.starts_with("https://")) || o.ends_with('/') {
                return bad(format!("allowed_origins: `{o}` is not an origin like https://host[:port]"));
            }
        }
        Ok(Access {
            tokens,
            proxy: self.proxy.clone(),
            secret,
            session_ttl_s,
            secure_cookie: self.secure_cookie,
            allowed_origins: self.allowed_origins.clone(),
        })
    }
}

/// An actor from configured or forwarded parts, checked: a K-2.0 name, bounded task roles.
pub(crate) fn checked_actor(name: &str, role: Role, task_roles: Vec<String>) -> std::result::Result<Actor, String> {
    kernel_core::validate::identifier("name", name).map_err(|e| e.to_string())?;
    if task_roles.len() > TASK_ROLES_MAX {
        return Err(format!("more than {TASK_ROLES_MAX} task roles"));
    }
    for r in &task_roles {
        kernel_core::validate::identifier("task role", r).map_err(|e| e.to_string())?;
    }
    Ok(Actor { name: name.to_string(), role, task_roles })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_is_checked() {
        let ok = r#"{"tokens":[{"token":"0123456789abcdef0123","name":"ana","role":"operator","task_roles":["finance"]},
            {"token_sha256":"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8","name":"vic","role":"viewer"}]}"#;
        let access = ServerConfig::from_json(ok).unwrap().check().unwrap();
        assert_eq!(access.tokens.len(), 2);
        assert_eq!(access.tokens[&token_digest("password")].name, "vic");
        assert_eq!(access.tokens[&token_digest("0123456789abcdef0123")].task_roles, ["finance"]);
        for bad in [
            r#"{"tokens":[{"token":"short","name":"ana","role":"operator"}]}"#,
            r#"{"tokens":[{"token":"0123456789abcdef0123","name":"","role":"operator"}]}"#,
            r#"{"tokens":[{"token":"0123456789abcdef0123","name":"ana","role":"admin"}]}"#,
            r#"{"tokens":[{"name":"ana","role":"viewer"}]}"#,
            r#"{"tokens":[{"token_sha256":"zz","name":"ana","role":"viewer"}]}"#,
            r#"{"secret":"too short"}"#,
            r#"{"session_ttl_s":0}"#,
            r#"{"allowed_origins":["ops.example.com"]}"#,
            r#"{"proxy":{"user":"bad header"}}"#,
            r#"{"unknown":1}"#,
        ] {
            let r = ServerConfig::from_json(bad).and_then(|c| c.check());
            assert!(matches!(r, Err(Error::Config(_))), "{bad}");
        }
    }
}
