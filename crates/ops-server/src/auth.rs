//! Who is asking, and may a POST come from where it comes from.
//!
//! Three ways in, tried in this order:
//! 1. `Authorization: Bearer <token>`: a configured token; a bad one is refused (401) and
//!    never falls back to the other ways. The header is not ambient (a browser never adds it
//!    on its own), so a bearer POST needs no CSRF token.
//! 2. The session cookie (`ops_session`, HttpOnly, SameSite=Strict) that `POST /api/login`
//!    sets in exchange for a token. The session id is 128 bits from the operating system's
//!    secure source; sessions live in this process, bounded in number and time.
//! 3. The user header of a configured fronting proxy (ignored unless configured).
//!
//! Every POST made with ambient credentials (the cookie, the proxy's header) carries
//! `X-CSRF-Token`: the HMAC-SHA-256 under the server secret of the session id (or of the
//! proxy user and role), which `GET /api/session` returns. Every POST, however
//! authenticated, is refused when its `Origin` (or, without one, its `Referer`) is not the
//! request's own host or a configured origin, or when `Sec-Fetch-Site` says cross-site.

use crate::config::{checked_actor, token_digest, Access, TOKEN_BYTES_MAX};
use axum::http::{header, HeaderMap, Method};
use hmac::{Hmac, KeyInit, Mac};
use ops::{Actor, Role};
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

type HmacSha256 = Hmac<Sha256>;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "ops_session";
/// The CSRF header's name.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Most live sessions; a login beyond it is refused (503) until some end.
pub const SESSIONS_MAX: usize = 10_000;
/// Most live sessions of one actor; their oldest is ended for a new one beyond it.
pub const SESSIONS_PER_ACTOR_MAX: usize = 16;

/// How a request was authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A bearer token.
    Bearer,
    /// A session cookie (the id).
    Session(String),
    /// A fronting proxy's header.
    Proxy,
}

impl Via {
    /// `bearer`, `session`, `proxy`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Via::Bearer => "bearer",
            Via::Session(_) => "session",
            Via::Proxy => "proxy",
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Who.
    pub actor: Actor,
    /// How.
    pub via: Via,
}

/// Why a request was refused before it reached the operator surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials, or bad ones (401).
    Unauthenticated(String),
    /// Authenticated, but the CSRF token or the origin is wrong (403).
    Forbidden(String),
}

struct Session {
    actor: Actor,
    expires: Instant,
}

pub(crate) struct Auth {
    access: Access,
    sessions: Mutex<HashMap<String, Session>>,
}

impl Auth {
    pub(crate) fn new(access: Access) -> Auth {
        Auth { access, sessions: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn secure_cookie(&self) -> bool {
        self.access.secure_cookie
    }

    pub(crate) fn session_ttl_s(&self) -> u64 {
        self.access.session_ttl_s
    }

    /// The actor of a configured token.
    pub(crate) fn token_actor(&self, token: &str) -> Option<Actor> {
        if token.is_empty() || token.len() > TOKEN_BYTES_MAX {
            return None;
        }
        self.access.tokens.get(&token_digest(token)).cloned()
    }

    /// A new session for `actor`: its id.
    pub(crate) fn open_session(&self, actor: Actor) -> Result<String, String> {
        let id = kernel_core::ports::os_task_token().map_err(|e| e.to_string())?;
        let now = Instant::now();
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.retain(|_, s| s.expires > now);
        // An actor's own oldest session makes room for their new one: logging in many times
        // never ends anybody else's session. A full table refuses the login.
        let mine: Vec<(String, Instant)> =
            sessions.iter().filter(|(_, s)| s.actor == actor).map(|(k, s)| (k.clone(), s.expires)).collect();
        if mine.len() >= SESSIONS_PER_ACTOR_MAX {
            if let Some((k, _)) = mine.iter().min_by_key(|(_, e)| *e) {
                sessions.remove(k);
            }
        }
        if sessions.len() >= SESSIONS_MAX {
            return Err(format!("{SESSIONS_MAX} sessions are open: try again when some have ended"));
        }
        sessions.insert(id.clone(), Session { actor, expires: now + Duration::from_secs(self.access.session_ttl_s) });
        Ok(id)
    }

    pub(crate) fn close_session(&self, id: &str) {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    fn session(&self, id: &str) -> Option<Actor> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        match sessions.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.actor.clone()),
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    /// The CSRF token of a principal; `None` for a bearer (it needs none).
    pub(crate) fn csrf_token(&self, p: &Principal) -> Option<String> {
        let subject = match &p.via {
            Via::Bearer => return None,
            Via::Session(id) => format!("session\n{id}"),
            Via::Proxy => {
                format!("proxy\n{}\n{}\n{}", p.actor.name, p.actor.role.as_str(), p.actor.task_roles.join(","))
            }
        };
        Some(hex::encode(self.mac(subject.as_bytes()).finalize().into_bytes()))
    }

    fn mac(&self, msg: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.access.secret).expect("HMAC accepts keys of any length");
        mac.update(msg);
        mac
    }

    fn csrf_ok(&self, p: &Principal, presented: Option<&str>) -> bool {
        let subject = match &p.via {
            Via::Bearer => return true,
            Via::Session(id) => format!("session\n{id}"),
            Via::Proxy => {
                format!("proxy\n{}\n{}\n{}", p.actor.name, p.actor.role.as_str(), p.actor.task_roles.join(","))
            }
        };
        let Some(presented) = presented else { return false };
        let mut bytes = [0u8; 32];
        if hex::decode_to_slice(presented, &mut bytes).is_err() {
            return false;
        }
        // `verify_slice` compares in constant time.
        self.mac(subject.as_bytes()).verify_slice(&bytes).is_ok()
    }

    /// Authenticate a request; for any method but GET and HEAD also check its origin and,
    /// for ambient credentials, its CSRF token.
    pub(crate) fn authenticate(&self, method: &Method, headers: &HeaderMap) -> Result<Principal, Refusal> {
        let p = self.identify(headers)?;
        if method != Method::GET && method != Method::HEAD {
            self.check_origin(headers)?;
            let presented = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
            if !self.csrf_ok(&p, presented) {
                return Err(Refusal::Forbidden(match presented {
                    None => "missing X-CSRF-Token header (GET /api/session returns it)".into(),
                    Some(_) => "bad X-CSRF-Token".into(),
                }));
            }
        }
        Ok(p)
    }

    pub(crate) fn identify(&self, headers: &HeaderMap) -> Result<Principal, Refusal> {
        if let Some(v) = headers.get(header::AUTHORIZATION) {
            let v = v.to_str().map_err(|_| Refusal::Unauthenticated("unreadable Authorization header".into()))?;
            let token = v
                .strip_prefix("Bearer ")
                .ok_or_else(|| Refusal::Unauthenticated("Authorization: only `Bearer <token>` is accepted".into()))?;
            return match self.token_actor(token.trim()) {
                Some(actor) => Ok(Principal { actor, via: Via::Bearer }),
                None => Err(Refusal::Unauthenticated("unknown bearer token".into())),
            };
        }
        if let Some(id) = session_cookie(headers) {
            if let Some(actor) = self.session(&id) {
                return Ok(Principal { actor, via: Via::Session(id) });
            }
        }
        if let Some(proxy) = &self.access.proxy {
            if let Some(user) = headers.get(proxy.user.as_str()) {
                let user =
                    user.to_str().map_err(|_| Refusal::Unauthenticated("unreadable proxy user header".into()))?;
                let role = match proxy.role.as_ref().and_then(|h| headers.get(h.as_str())) {
                    None => Role::Viewer,
                    Some(v) => match v.to_str().unwrap_or("").trim() {
                        "" | "viewer" => Role::Viewer,
                        "operator" => Role::Operator,
                        other => {
                            return Err(Refusal::Unauthenticated(format!(
                                "proxy role `{other}` is neither viewer nor operator"
                            )))
                        }
                    },
                };
                let task_roles = match proxy.task_roles.as_ref().and_then(|h| headers.get(h.as_str())) {
                    None => vec![],
                    Some(v) => v
                        .to_str()
                        .map_err(|_| Refusal::Unauthenticated("unreadable proxy task-roles header".into()))?
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                };
                let actor = checked_actor(user.trim(), role, task_roles)
                    .map_err(|m| Refusal::Unauthenticated(format!("proxy user: {m}")))?;
                return Ok(Principal { actor, via: Via::Proxy });
            }
        }
        Err(Refusal::Unauthenticated("no credentials: log in, or send Authorization: Bearer <token>".into()))
    }

    /// Refuse a cross-site state change: the `Origin` (else the `Referer`'s origin) must be
    /// the request's own host or a configured origin, and `Sec-Fetch-Site` must not say
    /// cross-site. A request with neither header (a script, not a browser) passes.
    pub(crate) fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) == Some("cross-site") {
            return Err(Refusal::Forbidden("a cross-site request may not change anything".into()));
        }
        let origin = match headers.get(header::ORIGIN) {
            Some(o) => Some(o.to_str().unwrap_or("").to_string()),
            None => headers.get(header::REFERER).and_then(|r| r.to_str().ok()).map(origin_of),
        };
        let Some(origin) = origin else { return Ok(()) };
        if self.access.allowed_origins.contains(&origin) {
            return Ok(());
        }
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let origin_host = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        match origin_host {
            Some(h) if !host.is_empty() && h.eq_ignore_ascii_case(host) => Ok(()),
            _ => Err(Refusal::Forbidden(format!("origin `{origin}` is not this server's"))),
        }
    }
}

/// `scheme://host[:port]` of a URL (the whole string when it has no path).
fn origin_of(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => url[..after_scheme + i].to_string(),
        None => url.to_string(),
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    for v in headers.get_all(header::COOKIE) {
        let Ok(v) = v.to_str() else { continue };
        for part in v.split(';') {
            if let Some((k, val)) = part.trim().split_once('=') {
                if k == SESSION_COOKIE && !val.is_empty() && val.len() <= 128 {
                    return Some(val.to_string());
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    fn auth() -> Auth {
        let c = ServerConfig::from_json(
            r#"{"tokens":[{"token":"op-token-0123456789","name":"ana","role":"operator"}],
                "proxy":{"user":"x-user","role":"x-role","task_roles":"x-groups"},
                "allowed_origins":["https://ops.example.com"]}"#,
        )
        .unwrap();
        Auth::new(c.check().unwrap())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn origins_are_checked() {
        let a = auth();
        let ok = [
            headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")]),
            headers(&[("host", "x:1"), ("origin", "https://ops.example.com")]),
            headers(&[("host", "x:1"), ("referer", "http://x:1/#/list")]),
            headers(&[("host", "x:1")]),
        ];
        for h in ok {
            assert_eq!(a.check_origin(&h), Ok(()), "{h:?}");
        }
        let bad = [
            headers(&[("host", "127.0.0.1:8080"), ("origin", "http://evil.example")]),
            headers(&[("host", "127.0.0.1:8080"), ("origin", "null")]),
            headers(&[("host", "x:1"), ("referer", "http://evil/x")]),
            headers(&[("host", "x:1"), ("sec-fetch-site", "cross-site")]),
        ];
        for h in bad {
            assert!(matches!(a.check_origin(&h), Err(Refusal::Forbidden(_))), "{h:?}");
        }
    }

    #[test]
    fn proxy_headers_and_sessions_identify() {
        let a = auth();
        let p =
            a.identify(&headers(&[("x-user", "bob"), ("x-role", "operator"), ("x-groups", "finance, legal")])).unwrap();
        assert_eq!((p.actor.name.as_str(), p.actor.role, p.via), ("bob", Role::Operator, Via::Proxy));
        assert_eq!(p.actor.task_roles, ["finance", "legal"]);
        assert!(a.identify(&headers(&[("x-user", "bob"), ("x-role", "root")])).is_err());
        let long = "u".repeat(300);
        assert!(a.identify(&headers(&[("x-user", &long)])).is_err());
        let id = a.open_session(Actor::viewer("vic")).unwrap();
        let cookie = format!("a=b; {SESSION_COOKIE}={id}");
        let p = a.identify(&headers(&[("cookie", &cookie)])).unwrap();
        assert_eq!(p.via, Via::Session(id.clone()));
        let csrf = a.csrf_token(&p).unwrap();
        assert!(a.csrf_ok(&p, Some(&csrf)));
        assert!(!a.csrf_ok(&p, Some(&csrf[..62])));
        assert!(!a.csrf_ok(&p, None));
        a.close_session(&id);
        assert!(a.identify(&headers(&[("cookie", &cookie)])).is_err());
    }

    #[test]
    fn logging_in_again_and_again_ends_only_one_s_own_oldest_sessions() {
        let a = auth();
        let operator = a.open_session(Actor::operator("olga")).unwrap();
        let first_vic = a.open_session(Actor::viewer("vic")).unwrap();
        for _ in 0..(SESSIONS_PER_ACTOR_MAX * 4) {
            a.open_session(Actor::viewer("vic")).unwrap();
        }
        assert!(a.session(&operator).is_some(), "another actor's session survives");
        assert!(a.session(&first_vic).is_none(), "vic's oldest was ended");
        let vic = Actor::viewer("vic");
        let live = a.sessions.lock().unwrap().values().filter(|s| s.actor == vic).count();
        assert_eq!(live, SESSIONS_PER_ACTOR_MAX);
    }
}
