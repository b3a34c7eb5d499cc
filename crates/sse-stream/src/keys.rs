//! Redis key names of one stream, keyed by the server's secret, and read grants.

use hmac::{Hmac, KeyInit, Mac};
use kernel_core::ports::StreamKey;
use kernel_core::{Error, Result};
use sha2::Sha256;
use std::sync::Arc;

type HmacSha256 = Hmac<Sha256>;

/// The server's secret that keys stream names and read grants (K-16).
///
/// Stream identities (object id, workflow id, round token such as `f1`) are public or easy
/// to guess; without the secret nobody can derive a stream's Redis keys or forge a read
/// grant. Every process that writes or serves the same streams shares it. Its `Debug`
/// never shows the bytes.
///
/// ```
/// use sse_stream::StreamSecret;
/// assert!(StreamSecret::new(vec![7u8; 32]).is_ok());
/// assert!(StreamSecret::new(b"short".to_vec()).is_err());
/// assert!(StreamSecret::from_hex(&"ab".repeat(32)).is_ok());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StreamSecret(Arc<[u8]>);

impl std::fmt::Debug for StreamSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamSecret(<{} bytes>)", self.0.len())
    }
}

impl StreamSecret {
    /// Fewest secret bytes accepted (the output size of SHA-256).
    pub const BYTES_MIN: usize = 32;

    /// A secret of at least [`BYTES_MIN`](Self::BYTES_MIN) bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes = bytes.into();
        if bytes.len() < Self::BYTES_MIN {
            return Err(Error::invalid("stream secret", format_args!("needs at least {} bytes", Self::BYTES_MIN)));
        }
        Ok(StreamSecret(bytes.into()))
    }

    /// A secret given as hex (e.g. from an environment variable).
    pub fn from_hex(hex_str: &str) -> Result<Self> {
        let bytes = hex::decode(hex_str.trim()).map_err(|e| Error::invalid("stream secret", e))?;
        Self::new(bytes)
    }

    /// HMAC-SHA256 under this secret of `domain` and the length-prefixed parts of `key`, so
    /// two different identities (or purposes) never share an input.
    fn mac(&self, domain: &[u8], key: &StreamKey) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(domain);
        for part in [key.object_id.as_str(), key.workflow_id.as_str(), key.fencing_token.as_str()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }
}

/// The four keys of a stream. They share one hash tag, so a Lua script touching all of
/// them also works on Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamKeys {
    /// The frame list.
    pub frames: String,
    /// The generation counter.
    pub generation: String,
    /// The terminal reference.
    pub terminal: String,
    /// The greatest owner that wrote (K-16 fencing).
    pub owner: String,
}

impl StreamKeys {
    /// Keys of `key` under `prefix`: `<prefix>:sse:{<tag>}:frames|gen|term|owner`, where the
    /// tag is an HMAC-SHA256 under `secret` of the length-prefixed `object_id`,
    /// `workflow_id` and `fencing_token`: two identities never share keys whatever
    /// characters they contain, and nobody without the secret can name a stream's keys.
    pub fn new(prefix: &str, secret: &StreamSecret, key: &StreamKey) -> StreamKeys {
        let tag = hex::encode(&secret.mac(b"wfk-stream-keys\0", key).finalize().into_bytes()[..16]);
        let base = format!("{prefix}:sse:{{{tag}}}");
        StreamKeys {
            frames: format!("{base}:frames"),
            generation: format!("{base}:gen"),
            terminal: format!("{base}:term"),
            owner: format!("{base}:owner"),
        }
    }
}

/// The authorisation hook of a stream endpoint: whether the bearer of `credential` may
/// read the stream `key`. An SSE endpoint calls it before it builds a
/// [`Forwarder`](crate::Forwarder) and refuses the connection on an error.
pub trait StreamAuthorizer: Send + Sync + 'static {
    /// `Ok(())` when `credential` allows reading `key`.
    ///
    /// # Contract
    /// Refuses a missing or wrong credential with [`Error::InvalidInput`] (field
    /// `credential`); never touches the stream.
    fn authorize(&self, key: &StreamKey, credential: Option<&str>) -> Result<()>;
}

/// Read grants signed with the server's secret: the process that starts a workflow hands
/// the client [`grant`](Self::grant) for its stream; the endpoint checks it (in constant
/// time). A grant opens one stream (one object, workflow and round) and nothing else.
///
/// ```
/// use sse_stream::{ReadGrants, StreamAuthorizer, StreamKey, StreamSecret};
/// let grants = ReadGrants::new(StreamSecret::new(vec![1u8; 32]).unwrap());
/// let key = StreamKey { object_id: "doc-1".into(), workflow_id: "wf-1".into(), fencing_token: "f1".into() };
/// let grant = grants.grant(&key);
/// assert!(grants.authorize(&key, Some(&grant)).is_ok());
/// assert!(grants.authorize(&key, None).is_err());
/// let next = StreamKey { fencing_token: "f2".into(), ..key };
/// assert!(grants.authorize(&next, Some(&grant)).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct ReadGrants {
    secret: StreamSecret,
}

impl ReadGrants {
    const DOMAIN: &'static [u8] = b"wfk-stream-read\0";

    /// Grants under `secret`.
    pub fn new(secret: StreamSecret) -> Self {
        ReadGrants { secret }
    }

    /// The grant to read `key` (hex).
    pub fn grant(&self, key: &StreamKey) -> String {
        hex::encode(self.secret.mac(Self::DOMAIN, key).finalize().into_bytes())
    }
}

impl StreamAuthorizer for ReadGrants {
    fn authorize(&self, key: &StreamKey, credential: Option<&str>) -> Result<()> {
        let refused = || Error::invalid("credential", "no valid read grant for this stream");
        let tag = hex::decode(credential.ok_or_else(refused)?).map_err(|_| refused())?;
        self.secret.mac(Self::DOMAIN, key).verify_slice(&tag).map_err(|_| refused())
    }
}
