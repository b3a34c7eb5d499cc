//! Reading a URL: which scheme, which role, which driver, which database or key prefix.
//! Pure: nothing here connects.

use crate::ComposeError;

/// Database of a `mongodb://` URL without a path.
pub const DEFAULT_DATABASE: &str = "wfk";
/// Key prefix of a `redis://` URL without `?prefix=`.
pub const DEFAULT_PREFIX: &str = "wfk";
/// Schema of a `postgres://` URL without `?schema=` (store-postgres's default schema).
pub const DEFAULT_SCHEMA: &str = "workflow_kernel";

/// What a URL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Instances and the signal inbox (`--store`).
    Store,
    /// Ready lanes, wakeup doorbell and permits (`--queue`).
    Queue,
}

impl Role {
    /// The environment variable read when the flag is absent.
    pub fn env(self) -> &'static str {
        match self {
            Role::Store => crate::STORE_ENV,
            Role::Queue => crate::QUEUE_ENV,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Store => "store",
            Role::Queue => "queue",
        })
    }
}

/// A driver compose knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// MongoDB (`store-mongo`).
    Mongo,
    /// Redis (`queue-redis`, `permit-redis`).
    Redis,
    /// kernel-memory's in-process adapters; demos only.
    Memory,
    /// PostgreSQL (`store-postgres`).
    Postgres,
    /// One SQLite file: the store (`store-sqlite`) and, as a queue, coord-local's tables.
    Sqlite,
    /// coord-local's coordination in the store's SQLite file, or in this process.
    Local,
}

impl Scheme {
    /// Short name for logs and report lines: `mongo`, `redis`, `memory`, `postgres`,
    /// `sqlite`, `local`.
    pub fn kind(self) -> &'static str {
        match self {
            Scheme::Sqlite => "sqlite",
            Scheme::Local => "local",
            Scheme::Mongo => "mongo",
            Scheme::Postgres => "postgres",
            Scheme::Redis => "redis",
            Scheme::Memory => "memory",
        }
    }
}

/// One row of [`SCHEMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemeInfo {
    /// The URL schemes that select the driver, as written before `:`.
    pub names: &'static [&'static str],
    /// The driver.
    pub scheme: Scheme,
    /// The roles it can serve.
    pub roles: &'static [Role],
    /// The cargo feature of `compose` that compiles the driver.
    pub feature: &'static str,
}

/// Every scheme compose knows. **A new store or queue adds its row here** (for example
/// `postgres`/`postgresql` and `sqlite` as stores), a [`Scheme`] variant, a cargo feature
/// and a driver module; parsing, errors and the feature check then cover it.
pub const SCHEMES: &[SchemeInfo] = &[
    SchemeInfo { names: &["mongodb", "mongodb+srv"], scheme: Scheme::Mongo, roles: &[Role::Store], feature: "mongo" },
    SchemeInfo {
        names: &["redis", "rediss", "redis+cluster", "rediss+cluster"],
        scheme: Scheme::Redis,
        roles: &[Role::Queue],
        feature: "redis",
    },
    SchemeInfo { names: &["memory"], scheme: Scheme::Memory, roles: &[Role::Store, Role::Queue], feature: "memory" },
    SchemeInfo {
        names: &["postgres", "postgresql"],
        scheme: Scheme::Postgres,
        roles: &[Role::Store],
        feature: "postgres",
    },
    SchemeInfo { names: &["sqlite"], scheme: Scheme::Sqlite, roles: &[Role::Store, Role::Queue], feature: "sqlite" },
    SchemeInfo { names: &["local"], scheme: Scheme::Local, roles: &[Role::Queue], feature: "local" },
];

/// Whether this build has the driver behind `feature`.
// The arms differ from build to build; a `matches!` would hide which feature is which.
#[allow(clippy::match_like_matches_macro)]
fn compiled_in(feature: &str) -> bool {
    match feature {
        "mongo" => cfg!(feature = "mongo"),
        "redis" => cfg!(feature = "redis"),
        "memory" => cfg!(feature = "memory"),
        "postgres" => cfg!(feature = "postgres"),
        "sqlite" => cfg!(feature = "sqlite"),
        "local" => cfg!(feature = "local"),
        _ => false,
    }
}

/// A URL read for one role.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// What it is for.
    pub role: Role,
    /// The driver.
    pub scheme: Scheme,
    /// What the driver connects to: the URL without compose's own parameters (`prefix`).
    pub url: String,
    /// MongoDB: the database (the URL's path, else [`DEFAULT_DATABASE`]); Redis: the key
    /// prefix (`?prefix=`, else [`DEFAULT_PREFIX`]); PostgreSQL: the schema (`?schema=`,
    /// else [`DEFAULT_SCHEMA`]); SQLite: the file's path; `memory:` and `local`: empty.
    pub namespace: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("role", &self.role)
            .field("scheme", &self.scheme)
            .field("url", &redact(&self.url))
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Target {
    /// Read `url` for `role`, refusing unknown schemes, malformed URLs, schemes of another
    /// role and drivers this build does not have.
    pub fn parse(role: Role, url: &str) -> Result<Target, ComposeError> {
        Self::parse_with(role, url, &compiled_in)
    }

    /// [`parse`](Self::parse) with the set of compiled drivers given (tests check the
    /// "not compiled in" error whatever the build's features are).
    #[doc(hidden)]
    pub fn parse_with(role: Role, url: &str, compiled: &dyn Fn(&str) -> bool) -> Result<Target, ComposeError> {
        let malformed = |reason: &str| ComposeError::Malformed { role, url: redact(url), reason: reason.to_string() };
        // `local` is a whole URL: coordination on this machine.
        let url = if url.eq_ignore_ascii_case("local") { "local:" } else { url };
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(malformed("no scheme (expected <scheme>:…, e.g. mongodb://host/db)"));
        };
        let valid_scheme = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !valid_scheme {
            return Err(malformed("no scheme (expected <scheme>:…, e.g. mongodb://host/db)"));
        }
        let written = scheme.to_ascii_lowercase();
        let Some(info) = SCHEMES.iter().find(|i| i.names.contains(&written.as_str())) else {
            let known = SCHEMES.iter().flat_map(|i| i.names.iter()).copied().collect::<Vec<_>>().join(", ");
            return Err(ComposeError::UnknownScheme { role, url: redact(url), scheme: scheme.to_string(), known });
        };
        if !info.roles.contains(&role) {
            let serves = info.roles.iter().map(Role::to_string).collect::<Vec<_>>().join(", ");
            return Err(ComposeError::WrongRole { role, url: redact(url), scheme: written, serves });
        }
        if !compiled(info.feature) {
            return Err(ComposeError::NotCompiledIn { role, url: redact(url), scheme: written, feature: info.feature });
        }
        let (url, namespace) = match info.scheme {
            Scheme::Memory => {
                if !(rest.is_empty() || rest == "//") {
                    return Err(malformed("`memory:` takes nothing after the colon"));
                }
                (url.to_string(), String::new())
            }
            Scheme::Local => {
                if !rest.is_empty() {
                    return Err(malformed("`local` takes nothing after it (use sqlite:<path> for another file)"));
                }
                (url.to_string(), String::new())
            }
            Scheme::Sqlite => {
                // `sqlite:<path>`; `sqlite://<path>` as well (`sqlite:///abs/path`).
                let rest = rest.strip_prefix("//").unwrap_or(rest);
                let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
                if path.is_empty() {
                    return Err(malformed("expected sqlite:<path of the database file>"));
                }
                if path.contains('\0') {
                    return Err(malformed("the path contains NUL"));
                }
                let query_ok = match role {
                    Role::Store => {
                        query.is_empty()
                            || query.eq_ignore_ascii_case("synchronous=full")
                            || query.eq_ignore_ascii_case("synchronous=normal")
                    }
                    Role::Queue => query.is_empty(),
                };
                if !query_ok {
                    return Err(malformed(&format!(
                        "unknown parameter `{query}` (a store takes only ?synchronous=full|normal, a queue none)"
                    )));
                }
                (url.to_string(), path.to_string())
            }
            Scheme::Mongo => {
                let authority = rest.strip_prefix("//").ok_or_else(|| malformed("expected mongodb://host"))?;
                let (hosts, path) = authority.split_once('/').unwrap_or((authority, ""));
                let hosts = hosts.split_once('?').map_or(hosts, |(h, _)| h);
                let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
                if hosts.is_empty() {
                    return Err(malformed("no host"));
                }
                let db = path.split_once('?').map_or(path, |(d, _)| d);
                let db = if db.is_empty() { DEFAULT_DATABASE } else { db };
                // MongoDB's own rule for database names.
                if db.len() > 63 || db.chars().any(|c| matches!(c, '/' | '\\' | '.' | ' ' | '"' | '$' | '\0')) {
                    return Err(malformed(&format!("bad database name `{db}`")));
                }
                (url.to_string(), db.to_string())
            }
            Scheme::Redis => {
                let authority = rest.strip_prefix("//").ok_or_else(|| malformed("expected redis://host"))?;
                let (before_query, query) = authority.split_once('?').unwrap_or((authority, ""));
                let host = before_query.split_once('/').map_or(before_query, |(h, _)| h);
                let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
                if host.is_empty() {
                    return Err(malformed("no host"));
                }
                let mut prefix = None;
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    match pair.split_once('=') {
                        Some(("prefix", p)) => prefix = Some(p.to_string()),
                        _ => kept.push(pair),
                    }
                }
                let prefix = prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_string());
                if let Err(e) = kernel_core::validate::identifier("prefix", &prefix) {
                    return Err(malformed(&format!("bad key prefix: {e}")));
                }
                // The Redis key layouts set their own hash tags after the prefix.
                if prefix.contains(['{', '}']) {
                    return Err(malformed("bad key prefix: it must not contain `{` or `}`"));
                }
                let mut driver_url = format!("{scheme}://{before_query}");
                if !kept.is_empty() {
                    driver_url.push('?');
                    driver_url.push_str(&kept.join("&"));
                }
                (driver_url, prefix)
            }
            Scheme::Postgres => {
                let authority = rest.strip_prefix("//").ok_or_else(|| malformed("expected postgres://host"))?;
                let (before_query, query) = authority.split_once('?').unwrap_or((authority, ""));
                let host = before_query.split_once('/').map_or(before_query, |(h, _)| h);
                let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
                if host.is_empty() {
                    return Err(malformed("no host"));
                }
                let mut schema = None;
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    match pair.split_once('=') {
                        Some(("schema", s)) => schema = Some(s.to_string()),
                        _ => kept.push(pair),
                    }
                }
                let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
                if !postgres_schema_name(&schema) {
                    return Err(malformed(&format!(
                        "bad schema `{schema}`: 1-63 bytes of [a-z0-9_] starting with a letter or `_`"
                    )));
                }
                let mut driver_url = format!("{scheme}://{before_query}");
                if !kept.is_empty() {
                    driver_url.push('?');
                    driver_url.push_str(&kept.join("&"));
                }
                (driver_url, schema)
            }
        };
        Ok(Target { role, scheme: info.scheme, url, namespace })
    }
}

/// store-postgres's rule for schema names (spliced into statements, so checked instead of
/// escaped): 1–63 bytes of `[a-z0-9_]`, not starting with a digit.
pub(crate) fn postgres_schema_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// `url` with the password of its user info replaced by `***`, for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else { return url.to_string() };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &str) -> bool {
        true
    }

    fn parse(role: Role, url: &str) -> Result<Target, ComposeError> {
        Target::parse_with(role, url, &all)
    }

    #[test]
    fn mongo_url_names_the_database_or_defaults() {
        let t = parse(Role::Store, "mongodb://127.0.0.1:27017/orders?retryWrites=true").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Mongo, "orders"));
        assert_eq!(t.url, "mongodb://127.0.0.1:27017/orders?retryWrites=true");
        let t = parse(Role::Store, "mongodb://u:p@a,b:27018").unwrap();
        assert_eq!(t.namespace, DEFAULT_DATABASE);
        let t = parse(Role::Store, "mongodb+srv://cluster.example.com/app").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Mongo, "app"));
    }

    #[test]
    fn a_redis_cluster_url_keeps_its_seed_list_for_the_driver() {
        let t = parse(Role::Queue, "redis+cluster://127.0.0.1:7000,127.0.0.1:7001?prefix=orders").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Redis, "orders"));
        assert_eq!(t.url, "redis+cluster://127.0.0.1:7000,127.0.0.1:7001");
        let t = parse(Role::Queue, "redis://:pw@a:1,b:2/?prefix=p&protocol=resp3").unwrap();
        assert_eq!((t.url.as_str(), t.namespace.as_str()), ("redis://:pw@a:1,b:2/?protocol=resp3", "p"));
    }

    #[test]
    fn redis_url_takes_the_prefix_out_for_the_driver() {
        let t = parse(Role::Queue, "redis://127.0.0.1:6379/2?prefix=orders&protocol=resp3").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Redis, "orders"));
        assert_eq!(t.url, "redis://127.0.0.1:6379/2?protocol=resp3");
        let t = parse(Role::Queue, "REDIS://localhost").unwrap();
        assert_eq!((t.url.as_str(), t.namespace.as_str()), ("REDIS://localhost", DEFAULT_PREFIX));
    }

    #[test]
    fn postgres_url_takes_the_schema_out_for_the_driver() {
        let t = parse(Role::Store, "postgres://app@127.0.0.1:5432/test?schema=orders&sslmode=disable").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Postgres, "orders"));
        assert_eq!(t.url, "postgres://app@127.0.0.1:5432/test?sslmode=disable");
        let t = parse(Role::Store, "postgresql://h/db").unwrap();
        assert_eq!(
            (t.scheme, t.namespace.as_str(), t.url.as_str()),
            (Scheme::Postgres, DEFAULT_SCHEMA, "postgresql://h/db")
        );
        assert_eq!(Scheme::Postgres.kind(), "postgres");
    }

    #[test]
    fn sqlite_url_names_the_file_and_local_names_nothing() {
        let t = parse(Role::Store, "sqlite:./wf.db").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str(), t.url.as_str()), (Scheme::Sqlite, "./wf.db", "sqlite:./wf.db"));
        let t = parse(Role::Store, "sqlite:///var/lib/wf.db?synchronous=normal").unwrap();
        assert_eq!(t.namespace, "/var/lib/wf.db");
        let t = parse(Role::Queue, "SQLITE:wf.db").unwrap();
        assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Sqlite, "wf.db"));
        for url in ["local", "LOCAL", "local:"] {
            let t = parse(Role::Queue, url).unwrap();
            assert_eq!((t.scheme, t.namespace.as_str()), (Scheme::Local, ""), "{url}");
        }
        assert_eq!((Scheme::Sqlite.kind(), Scheme::Local.kind()), ("sqlite", "local"));
    }

    #[test]
    fn memory_serves_both_roles() {
        for role in [Role::Store, Role::Queue] {
            assert_eq!(parse(role, "memory:").unwrap().scheme, Scheme::Memory);
            assert_eq!(parse(role, "memory://").unwrap().scheme, Scheme::Memory);
        }
    }

    #[test]
    fn unknown_scheme_is_a_typed_error_listing_the_known_ones() {
        let e = parse(Role::Store, "cassandra://db.example.com/app").unwrap_err();
        assert!(matches!(&e, ComposeError::UnknownScheme { scheme, role: Role::Store, .. } if scheme == "cassandra"));
        let msg = e.to_string();
        assert!(
            msg.contains("unknown scheme `cassandra`")
                && msg.contains("sqlite")
                && msg.contains("mongodb")
                && msg.contains("redis")
                && msg.contains("postgresql"),
            "{msg}"
        );
    }

    #[test]
    fn malformed_urls_are_typed_errors() {
        for (role, url, why) in [
            (Role::Store, "127.0.0.1:27017", "no scheme"),
            (Role::Store, "just-a-word", "no scheme"),
            (Role::Store, "mongodb:127.0.0.1", "expected mongodb://host"),
            (Role::Store, "mongodb:///db", "no host"),
            (Role::Store, "mongodb://h/bad.name", "bad database name"),
            (Role::Queue, "redis://", "no host"),
            (Role::Queue, "redis://h?prefix=", "bad key prefix"),
            (Role::Queue, "redis://h?prefix=a\tb", "bad key prefix"),
            (Role::Queue, "redis://h?prefix={wfk}", "bad key prefix"),
            (Role::Queue, "memory:extra", "takes nothing"),
            (Role::Store, "postgres:h/db", "expected postgres://host"),
            (Role::Store, "postgres:///db", "no host"),
            (Role::Store, "postgres://h/db?schema=Bad", "bad schema"),
            (Role::Store, "postgres://h/db?schema=1st", "bad schema"),
            (Role::Store, "postgres://h/db?schema=", "bad schema"),
            (Role::Store, "sqlite:", "expected sqlite:<path"),
            (Role::Store, "sqlite://", "expected sqlite:<path"),
            (Role::Store, "sqlite:wf.db?synchronous=off", "unknown parameter"),
            (Role::Queue, "sqlite:wf.db?synchronous=normal", "unknown parameter"),
            (Role::Queue, "local:wf.db", "takes nothing"),
        ] {
            match parse(role, url) {
                Err(ComposeError::Malformed { reason, .. }) => assert!(reason.contains(why), "{url}: {reason}"),
                other => panic!("{url}: expected Malformed, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_driver_not_compiled_in_is_a_typed_error_naming_the_feature() {
        let none = |_: &str| false;
        for (role, url, feature) in [
            (Role::Store, "mongodb://h/db", "mongo"),
            (Role::Queue, "redis://h", "redis"),
            (Role::Store, "memory:", "memory"),
            (Role::Store, "postgres://h/db", "postgres"),
            (Role::Store, "sqlite:wf.db", "sqlite"),
            (Role::Queue, "local", "local"),
        ] {
            match Target::parse_with(role, url, &none) {
                Err(e @ ComposeError::NotCompiledIn { .. }) => {
                    let ComposeError::NotCompiledIn { feature: f, .. } = &e else { unreachable!() };
                    assert_eq!(*f, feature);
                    assert!(e.to_string().contains(&format!("feature `{feature}`")), "{e}");
                }
                other => panic!("{url}: expected NotCompiledIn, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_scheme_in_the_wrong_role_is_a_typed_error() {
        let e = parse(Role::Store, "redis://h").unwrap_err();
        assert!(matches!(e, ComposeError::WrongRole { role: Role::Store, .. }), "{e:?}");
        let e = parse(Role::Queue, "mongodb://h/db").unwrap_err();
        assert!(matches!(e, ComposeError::WrongRole { role: Role::Queue, .. }), "{e:?}");
        let e = parse(Role::Queue, "postgres://h/db").unwrap_err();
        assert!(matches!(e, ComposeError::WrongRole { role: Role::Queue, .. }), "{e:?}");
        let e = parse(Role::Store, "local").unwrap_err();
        assert!(matches!(e, ComposeError::WrongRole { role: Role::Store, .. }), "{e:?}");
    }

    #[test]
    fn the_build_reports_its_own_features() {
        assert_eq!(compiled_in("mongo"), cfg!(feature = "mongo"));
        assert_eq!(compiled_in("redis"), cfg!(feature = "redis"));
        assert_eq!(compiled_in("memory"), cfg!(feature = "memory"));
        assert_eq!(compiled_in("postgres"), cfg!(feature = "postgres"));
        assert_eq!(compiled_in("sqlite"), cfg!(feature = "sqlite"));
        assert_eq!(compiled_in("local"), cfg!(feature = "local"));
        assert!(!compiled_in("cassandra"));
    }

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(redact("mongodb://app:s3cret@h:27017/db"), "mongodb://app:***@h:27017/db");
        assert_eq!(redact("redis://:s3cret@h/0?prefix=x"), "redis://:***@h/0?prefix=x");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("postgres://app:s3cret@h/db?schema=s"), "postgres://app:***@h/db?schema=s");
        let e = parse(Role::Store, "mongodb://app:s3cret@h/bad.name").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
