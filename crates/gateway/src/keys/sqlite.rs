//! The embedded key store: one SQLite file (WAL), or `:memory:`.

use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use super::{decide, Admission, KeyRecord, KeySpec, LedgerRow, StoreError, WINDOW_MS};

pub struct SqliteStore {
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS keys (
    token TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created INTEGER NOT NULL,
    spent_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS window_requests (token TEXT NOT NULL, ts INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS window_requests_i ON window_requests (token, ts);
CREATE TABLE IF NOT EXISTS window_tokens (token TEXT NOT NULL, ts INTEGER NOT NULL, tokens INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS window_tokens_i ON window_tokens (token, ts);
CREATE TABLE IF NOT EXISTS ledger (
    token TEXT NOT NULL,
    model TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (token, model)
);
";

impl SqliteStore {
    pub fn open(path: &str) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        if path != ":memory:" {
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    pub fn insert(&self, rec: &KeyRecord) -> Result<(), StoreError> {
        let spec =
            serde_json::to_string(&rec.spec).map_err(|e| StoreError::Other(e.to_string()))?;
        self.conn.lock().unwrap().execute(
            "INSERT INTO keys (token, spec, created, spent_tokens) VALUES (?1, ?2, ?3, 0)",
            params![rec.token, spec, rec.created],
        )?;
        Ok(())
    }

    fn row(token: String, spec: String, created: i64, spent: i64) -> Result<KeyRecord, StoreError> {
        let spec: KeySpec = serde_json::from_str(&spec)
            .map_err(|e| StoreError::Other(format!("stored key {token}: {e}")))?;
        Ok(KeyRecord {
            token,
            spec,
            created,
            spent_tokens: spent.max(0) as u64,
        })
    }

    pub fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let c = self.conn.lock().unwrap();
        let mut st = c.prepare(
            "SELECT token, spec, created, spent_tokens FROM keys ORDER BY created, token",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        let mut out = Vec::new();
        for r in rows {
            let (t, s, c, sp) = r?;
            out.push(Self::row(t, s, c, sp)?);
        }
        Ok(out)
    }

    fn get_in(c: &Connection, token: &str) -> Result<Option<KeyRecord>, StoreError> {
        let r = c
            .query_row(
                "SELECT token, spec, created, spent_tokens FROM keys WHERE token = ?1",
                [token],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        r.map(|(t, s, c, sp)| Self::row(t, s, c, sp)).transpose()
    }

    pub fn get(&self, token: &str) -> Result<Option<KeyRecord>, StoreError> {
        Self::get_in(&self.conn.lock().unwrap(), token)
    }

    pub fn delete(&self, token: &str) -> Result<bool, StoreError> {
        let c = self.conn.lock().unwrap();
        let n = c.execute("DELETE FROM keys WHERE token = ?1", [token])?;
        c.execute("DELETE FROM window_requests WHERE token = ?1", [token])?;
        c.execute("DELETE FROM window_tokens WHERE token = ?1", [token])?;
        Ok(n > 0)
    }

    pub fn admit(&self, token: &str, model: &str, now: i64) -> Result<Admission, StoreError> {
        let mut c = self.conn.lock().unwrap();
        let tx = c.transaction()?;
        let Some(rec) = Self::get_in(&tx, token)? else {
            return Ok(Admission::UnknownKey);
        };
        let from = now - WINDOW_MS;
        tx.execute(
            "DELETE FROM window_requests WHERE token = ?1 AND ts <= ?2",
            params![token, from],
        )?;
        tx.execute(
            "DELETE FROM window_tokens WHERE token = ?1 AND ts <= ?2",
            params![token, from],
        )?;
        let (n, oldest): (i64, Option<i64>) = tx.query_row(
            "SELECT COUNT(*), MIN(ts) FROM window_requests WHERE token = ?1",
            [token],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let (used, oldest_t): (Option<i64>, Option<i64>) = tx.query_row(
            "SELECT SUM(tokens), MIN(ts) FROM window_tokens WHERE token = ?1",
            [token],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let a = decide(
            &rec,
            model,
            n as u64,
            oldest,
            used.unwrap_or(0).max(0) as u64,
            oldest_t,
            now,
        );
        if matches!(a, Admission::Admitted { .. }) {
            tx.execute(
                "INSERT INTO window_requests (token, ts) VALUES (?1, ?2)",
                params![token, now],
            )?;
        }
        tx.commit()?;
        Ok(a)
    }

    pub fn record_usage(
        &self,
        token: &str,
        model: &str,
        prompt: u64,
        completion: u64,
        now: i64,
    ) -> Result<(), StoreError> {
        let mut c = self.conn.lock().unwrap();
        let tx = c.transaction()?;
        let total = (prompt + completion) as i64;
        tx.execute(
            "INSERT INTO window_tokens (token, ts, tokens) VALUES (?1, ?2, ?3)",
            params![token, now, total],
        )?;
        tx.execute(
            "UPDATE keys SET spent_tokens = spent_tokens + ?2 WHERE token = ?1",
            params![token, total],
        )?;
        tx.execute(
            "INSERT INTO ledger (token, model, requests, prompt_tokens, completion_tokens)
             VALUES (?1, ?2, 1, ?3, ?4)
             ON CONFLICT (token, model) DO UPDATE SET requests = requests + 1,
                 prompt_tokens = prompt_tokens + ?3, completion_tokens = completion_tokens + ?4",
            params![token, model, prompt as i64, completion as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn ledger(&self, token: &str) -> Result<Vec<LedgerRow>, StoreError> {
        let c = self.conn.lock().unwrap();
        let mut st = c.prepare(
            "SELECT model, requests, prompt_tokens, completion_tokens FROM ledger
             WHERE token = ?1 ORDER BY model",
        )?;
        let rows = st.query_map([token], |r| {
            Ok(LedgerRow {
                model: r.get(0)?,
                requests: r.get::<_, i64>(1)? as u64,
                prompt_tokens: r.get::<_, i64>(2)? as u64,
                completion_tokens: r.get::<_, i64>(3)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
