//! The dispatch outbox on a PostgreSQL business table: the shared conformance suite, each
//! case in a fresh schema.

use crate::support::TestSchema;
use kernel_core::ports::DynOutbox;
use store_postgres::{OutboxTable, PostgresOutbox};

/// Outbox fixture: a business table in a fresh schema.
pub struct OutboxDb(TestSchema, PostgresOutbox);

impl testkit::conformance::outbox::OutboxFixture for OutboxDb {
    fn outbox(&self) -> &DynOutbox {
        &self.1
    }
    fn teardown(self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(self.0.drop_schema())
    }
}

/// A fresh fixture, or `None` when the PostgreSQL tests are skipped.
pub async fn outbox_fixture() -> Option<OutboxDb> {
    let t = TestSchema::new().await?;
    let table = OutboxTable { schema: t.schema().to_string(), ..OutboxTable::default() };
    let o = PostgresOutbox::new(t.pool.clone(), t.config.clone(), table).expect("outbox");
    o.ensure_table().await.expect("create the business table");
    o.ensure_table().await.expect("idempotent");
    Some(OutboxDb(t, o))
}

mod conformance {
    testkit::outbox_conformance!(super::outbox_fixture);
}
