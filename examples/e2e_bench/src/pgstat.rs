//! The PostgreSQL run's own database and the server's figures: a fresh database per run
//! (so that `pg_stat_database.xact_commit` counts this run's transactions only, plus the
//! server's autovacuum in it), its durability settings, and its commit counter.

use std::time::Duration;
use tokio_postgres::Client;

/// A connection to the server's original database, watching the bench database.
pub struct PgStat {
    admin: Client,
    database: String,
}

fn pg(what: &'static str) -> impl Fn(tokio_postgres::Error) -> String {
    move |e| format!("postgres {what}: {e}")
}

/// `url` with its database replaced by `database` (the query string kept).
pub fn with_database(url: &str, database: &str) -> Result<String, String> {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let after_scheme = base.find("://").ok_or_else(|| format!("postgres url without `://`: {url}"))? + 3;
    let authority_end = base[after_scheme..].find('/').map_or(base.len(), |i| after_scheme + i);
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

impl PgStat {
    /// Create a fresh database `e2e_bench_<hex>` on the server `url` names; return the
    /// watcher and the URL of the new database.
    pub async fn create(url: &str) -> Result<(PgStat, String), String> {
        let admin = crate::pgfloor::connect(url).await?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let database = format!("e2e_bench_{:x}", nanos ^ (u128::from(std::process::id()) << 96));
        admin.batch_execute(&format!("CREATE DATABASE \"{database}\"")).await.map_err(pg("create the database"))?;
        let bench_url = with_database(url, &database)?;
        Ok((PgStat { admin, database }, bench_url))
    }

    /// ` postgres_version=… synchronous_commit=… fsync=… database=…` for the setup line.
    pub async fn setup_fields(&self) -> Result<String, String> {
        let mut out = String::new();
        for name in ["server_version", "synchronous_commit", "fsync", "max_connections"] {
            let row = self.admin.query_one("SELECT current_setting($1)", &[&name]).await.map_err(pg("settings"))?;
            let v: String = row.get(0);
            out.push_str(&format!(" postgres_{name}={}", v.split_whitespace().next().unwrap_or("?")));
        }
        Ok(out.replace("postgres_synchronous_commit", "synchronous_commit").replace("postgres_fsync", "fsync"))
    }

    async fn commits(&self) -> Result<u64, String> {
        self.admin.batch_execute("SELECT pg_stat_clear_snapshot()").await.map_err(pg("stats snapshot"))?;
        let row = self
            .admin
            .query_one("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", &[&self.database])
            .await
            .map_err(pg("pg_stat_database"))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// The bench database's committed transactions once every backend reported its own:
    /// PostgreSQL 15 flushes a backend's counts at most once a second while busy and,
    /// once idle, within `PGSTAT_IDLE_INTERVAL` (10 s). So the counter is read after 11 s
    /// and then every 500 ms until two reads agree.
    pub async fn settled_commits(&self) -> Result<u64, String> {
        tokio::time::sleep(Duration::from_millis(11_000)).await;
        let mut last = self.commits().await?;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.commits().await?;
            if now == last {
                return Ok(now);
            }
            last = now;
        }
        Ok(last)
    }

    /// Drop the bench database (its remaining connections are ended first).
    pub async fn drop_database(self) -> Result<(), String> {
        self.admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.database))
            .await
            .map_err(pg("drop the database"))
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced_and_the_rest_kept() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "b").unwrap(),
            "postgres://postgres@127.0.0.1:5432/b"
        );
        assert_eq!(
            with_database("postgresql://u:p@h/db?sslmode=disable", "b").unwrap(),
            "postgresql://u:p@h/b?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "b").unwrap(), "postgres://h/b");
        assert!(with_database("h/db", "b").is_err());
    }
}
