//! The driver's rows as [`SqlRow`]: the decoders themselves are written once in
//! [`sql_protocol::row`]. A value that does not read is [`Error::Corrupt`] naming the
//! column; scans quarantine the row instead (see `store.rs`).

use kernel_core::{Error, Result};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sql_protocol::row::corrupt_with;
use sql_protocol::SqlRow;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Row;

/// A tokio-postgres row read by column name; JSON columns are `jsonb`, text arrays `text[]`.
pub(crate) struct R<'a>(pub(crate) &'a Row);

pub(crate) fn col<'a, T: FromSql<'a>>(row: &'a Row, column: &str) -> Result<T> {
    row.try_get::<_, T>(column).map_err(|e| Error::Corrupt {
        message: format!("column `{column}`: {e}"),
        workflow_id: None,
        cause: Some(e.into()),
    })
}

impl R<'_> {
    fn ty(&self, column: &str) -> Option<&Type> {
        self.0.columns().iter().find(|c| c.name() == column).map(|c| c.type_())
    }
}

impl SqlRow for R<'_> {
    fn text(&self, column: &str) -> Result<String> {
        col(self.0, column)
    }

    fn opt_text(&self, column: &str) -> Result<Option<String>> {
        col(self.0, column)
    }

    fn int(&self, column: &str) -> Result<i64> {
        match self.ty(column) {
            Some(&Type::INT2) => col::<i16>(self.0, column).map(i64::from),
            Some(&Type::INT4) => col::<i32>(self.0, column).map(i64::from),
            _ => col(self.0, column),
        }
    }

    fn opt_int(&self, column: &str) -> Result<Option<i64>> {
        match self.ty(column) {
            Some(&Type::INT2) => col::<Option<i16>>(self.0, column).map(|v| v.map(i64::from)),
            Some(&Type::INT4) => col::<Option<i32>>(self.0, column).map(|v| v.map(i64::from)),
            _ => col(self.0, column),
        }
    }

    fn boolean(&self, column: &str) -> Result<bool> {
        col(self.0, column)
    }

    fn opt_json<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>> {
        col::<Option<Value>>(self.0, column)?
            .map(|v| serde_json::from_value(v).map_err(|e| corrupt_with(column, e)))
            .transpose()
    }

    fn text_array(&self, column: &str) -> Result<Vec<String>> {
        col(self.0, column)
    }
}
