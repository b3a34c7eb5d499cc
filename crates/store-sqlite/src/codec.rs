//! The driver's rows as [`SqlRow`]: the decoders themselves are written once in
//! [`sql_protocol::row`]. A value that does not read is [`Error::Corrupt`] naming the
//! column; scans quarantine the row instead (see `store.rs`).

use kernel_core::{Error, Result};
use rusqlite::types::FromSql;
use serde::de::DeserializeOwned;
use sql_protocol::row::corrupt_with;
use sql_protocol::SqlRow;

/// A rusqlite row read by column name; JSON and text arrays are JSON text.
pub(crate) struct R<'a, 'b>(pub(crate) &'a rusqlite::Row<'b>);

pub(crate) fn col<T: FromSql>(row: &rusqlite::Row<'_>, column: &str) -> Result<T> {
    row.get::<_, T>(column).map_err(|e| Error::Corrupt {
        message: format!("column `{column}`: {e}"),
        workflow_id: None,
        cause: Some(e.into()),
    })
}

impl SqlRow for R<'_, '_> {
    fn text(&self, column: &str) -> Result<String> {
        col(self.0, column)
    }

    fn opt_text(&self, column: &str) -> Result<Option<String>> {
        col(self.0, column)
    }

    fn int(&self, column: &str) -> Result<i64> {
        col(self.0, column)
    }

    fn opt_int(&self, column: &str) -> Result<Option<i64>> {
        col(self.0, column)
    }

    fn boolean(&self, column: &str) -> Result<bool> {
        Ok(col::<i64>(self.0, column)? != 0)
    }

    fn opt_json<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>> {
        col::<Option<String>>(self.0, column)?
            .map(|v| serde_json::from_str(&v).map_err(|e| corrupt_with(column, e)))
            .transpose()
    }

    fn text_array(&self, column: &str) -> Result<Vec<String>> {
        self.json(column)
    }
}
