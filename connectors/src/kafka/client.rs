//! The one place Kafka clients are configured: the source's consumers, the sink's producers,
//! topic creation, `riffle produce` and `riffle consume` all start from [`client_config`].

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::ClientConfig;

use super::config::{KafkaSinkConfig, StartAt};

/// What a client is created for; each role sets the librdkafka options it depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role<'a> {
    /// A source consumer of `topic` (metadata, sampling or reading). It joins no group:
    /// offsets belong to Riffle's checkpoints.
    SourceConsumer {
        topic: &'a str,
        /// Report the end of each partition (`enable.partition.eof`).
        partition_eof: bool,
        /// Emit statistics every second (they carry each partition's high watermark).
        statistics: bool,
    },
    /// The sink's producers (results and commit markers): idempotent, acknowledged by all
    /// replicas.
    SinkProducer,
    /// `riffle produce`'s producer: idempotent, batching for a few milliseconds.
    ReplayProducer,
    /// A member of consumer group `group` (`group_id:` sources), or a client reading its
    /// committed offsets. The offsets are committed by the sink's transactions, never here.
    GroupConsumer { group: &'a str, start: &'a StartAt },
    /// Topic creation and metadata look-ups: only the brokers.
    Admin,
    /// A reader of a whole results topic to its end (`riffle consume`).
    ResultsReader,
}

/// How long a consumer whose local queue is full waits before fetching again. librdkafka's
/// default (1 s) left a worker slower than the broker idle for most of a second at every
/// refill of a busy partition (seen as ~850 ms stalls reading a topic whose messages sit in
/// one partition).
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// The configuration of a client of `brokers` for `role`; `options` (the pipeline's
/// `options:` map, passed through to librdkafka) are applied last, so they override Riffle's
/// settings.
pub fn client_config(
    brokers: &str,
    options: &BTreeMap<String, String>,
    role: Role<'_>,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    match role {
        Role::SourceConsumer {
            topic,
            partition_eof,
            statistics,
        } => {
            // Offsets belong to Riffle; the group only receives advisory commits for lag tools.
            c.set("group.id", format!("riffle-{topic}"))
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                // An explicit start offset that has been deleted by retention restarts at the
                // oldest message rather than skipping to the end.
                .set("auto.offset.reset", "earliest")
                .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
            if statistics {
                c.set("statistics.interval.ms", "1000");
            }
            if partition_eof {
                c.set("enable.partition.eof", "true");
            }
        }
        Role::SinkProducer => {
            // No duplicates or reordering on retries, and a write counts once all replicas
            // have it.
            c.set("enable.idempotence", "true").set("acks", "all");
        }
        Role::ReplayProducer => {
            c.set("enable.idempotence", "true").set("linger.ms", "5");
        }
        Role::GroupConsumer { group, start } => {
            c.set("group.id", group)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                // Only stable offsets: a new owner waits for a pending transaction's offsets.
                .set("isolation.level", "read_committed")
                .set("partition.assignment.strategy", "cooperative-sticky")
                // Partitions added to the topic join the assignment within seconds, not
                // librdkafka's default 5 minutes.
                .set("topic.metadata.refresh.interval.ms", "5000")
                .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
                .set(
                    "auto.offset.reset",
                    if *start == StartAt::Latest {
                        "latest"
                    } else {
                        "earliest"
                    },
                );
        }
        Role::Admin => {}
        Role::ResultsReader => {
            // Transactional output counts once committed; aborted attempts are skipped.
            c.set("group.id", "riffle-consume")
                .set("isolation.level", "read_committed")
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "true")
                // Smaller fetches: a slow broker (tansu on sqlite serves ~1 ms per message)
                // answers each sooner.
                .set("max.partition.fetch.bytes", "262144");
        }
    }
    for (key, value) in options {
        c.set(key, value);
    }
    c
}

/// Waits until every message `producer` sent is acknowledged (or failed), serving delivery
/// reports; `false` if some are still in flight after `timeout`. rdkafka's own `flush` polls
/// in 100 ms steps, which adds up to a tenth of a second to every wait; and its `poll` spins
/// (non-blocking polls) through a last sub-millisecond remainder, so this sleeps instead.
pub fn drain<C: rdkafka::producer::ProducerContext>(
    producer: &rdkafka::producer::BaseProducer<C>,
    timeout: std::time::Duration,
) -> bool {
    use rdkafka::producer::Producer;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        producer.poll(std::time::Duration::ZERO);
        if producer.in_flight_count() == 0 {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
}

/// The context of consumers that read to the end of partitions (`enable.partition.eof`):
/// the end of a partition is expected there, and librdkafka sometimes reports it through the
/// error callback as well as through `poll`, which rdkafka's default context logs as an
/// ERROR. Other client errors are logged as warnings (librdkafka retries them).
#[derive(Default)]
pub struct ReadsToEnd;

impl ClientContext for ReadsToEnd {
    fn error(&self, error: KafkaError, reason: &str) {
        if !is_partition_eof(&error) {
            tracing::warn!("kafka client: {error}: {reason}");
        }
    }
}

impl ConsumerContext for ReadsToEnd {}

/// Whether `error` is only the end of a partition.
pub fn is_partition_eof(error: &KafkaError) -> bool {
    matches!(error, KafkaError::PartitionEOF(_))
        || error.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::PartitionEOF)
}

/// A client context that keeps the first client-wide error librdkafka reports (failed
/// authentication, TLS handshake, unreachable broker) instead of logging every retry, so a
/// request that then fails can say why, once.
#[derive(Default)]
pub struct Diagnosed {
    first: Mutex<Option<String>>,
    /// The first error that retrying cannot cure (credentials, SASL mechanism, TLS): a wait
    /// for the brokers ends at once when one comes.
    fatal: Mutex<Option<String>>,
}

impl ClientContext for Diagnosed {
    fn error(&self, error: KafkaError, reason: &str) {
        self.keep(format!("{error}: {reason}"));
    }

    // librdkafka reports a failed connection (authentication, TLS) as a log line, repeated on
    // every retry: keep the first, print none.
    fn log(&self, level: RDKafkaLogLevel, _facility: &str, message: &str) {
        if (level as i32) <= (RDKafkaLogLevel::Error as i32) {
            self.keep(message.to_string());
        }
    }
}

impl ConsumerContext for Diagnosed {}

impl Diagnosed {
    fn keep(&self, what: String) {
        if Cause::is_fatal(&what) {
            let mut fatal = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
            fatal.get_or_insert_with(|| what.clone());
        }
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(what);
    }

    /// The first error reported that retrying cannot cure, if one came.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first error reported, if any.
    pub fn first(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What most likely went wrong, and the error behind it: the first that retrying cannot
    /// cure, else the first of all. librdkafka queues its logs and errors for the client's
    /// poll: serve them first (`poll`).
    pub fn explain(&self, fallback: &dyn std::fmt::Display) -> String {
        let detail = self
            .fatal()
            .or_else(|| self.first())
            .unwrap_or_else(|| fallback.to_string());
        format!("{}: {detail}", Cause::of(&detail).describe())
    }
}

/// What a client error most likely comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// The brokers offer no SASL mechanism of those configured.
    Mechanism,
    Authentication,
    Tls,
    /// Anything else: most often brokers that are down or unreachable, which may pass.
    Unreachable,
}

impl Cause {
    fn of(detail: &str) -> Cause {
        let mut d = detail.to_ascii_lowercase();
        // Broker names carry their protocol (`sasl_ssl://host:9093/1`), whatever failed.
        for protocol in ["sasl_ssl://", "sasl_plaintext://", "ssl://", "plaintext://"] {
            d = d.replace(protocol, "");
        }
        // "SASL SCRAM-SHA-256 mechanism handshake failed: Broker: Unsupported SASL mechanism":
        // a handshake, but SASL's, not TLS's.
        if d.contains("mechanism")
            && (d.contains("unsupported") || d.contains("not supported") || d.contains("handshake"))
        {
            Cause::Mechanism
        } else if d.contains("authentication") || d.contains("invalid credentials") {
            Cause::Authentication
        } else if d.contains("ssl") || d.contains("certificate") || d.contains("handshake") {
            Cause::Tls
        } else {
            Cause::Unreachable
        }
    }

    /// Whether `detail` is an error that retrying cannot cure. A disconnection that only
    /// may come from a wrong `security.protocol` is not: a restarting broker does the same.
    fn is_fatal(detail: &str) -> bool {
        match Cause::of(detail) {
            Cause::Mechanism | Cause::Authentication => true,
            Cause::Tls => {
                let d = detail.to_ascii_lowercase();
                d.contains("handshake") || d.contains("certificate")
            }
            Cause::Unreachable => false,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Cause::Mechanism => {
                "the brokers do not offer this SASL mechanism (check sasl.mechanisms against \
                 the mechanisms they list)"
            }
            Cause::Authentication => {
                "authentication failed (check sasl.username, sasl.password and sasl.mechanisms)"
            }
            Cause::Tls => "the TLS connection failed (check security.protocol and ssl.ca.location)",
            Cause::Unreachable => {
                "the brokers are unreachable (check brokers and security.protocol)"
            }
        }
    }
}

/// A plain-words cause for a client error.
#[cfg(test)]
fn likely_cause(detail: &str) -> &'static str {
    Cause::of(detail).describe()
}

/// The first slice of a wait for metadata; later ones double, up to [`METADATA_SLICE_MAX`].
const METADATA_SLICE: Duration = Duration::from_millis(250);
const METADATA_SLICE_MAX: Duration = Duration::from_secs(2);

/// The cluster's metadata (of `topic` only, when given), waiting up to `timeout` for the
/// brokers, but no longer than it takes librdkafka to report an error retrying cannot cure
/// (wrong credentials, SASL mechanism or CA: reported within a second, while a plain
/// request would wait out its whole timeout). The error says what most likely went wrong.
pub fn fetch_metadata(
    consumer: &BaseConsumer<Diagnosed>,
    topic: Option<&str>,
    timeout: Duration,
) -> Result<Metadata, String> {
    let deadline = Instant::now() + timeout;
    let mut slice = METADATA_SLICE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_metadata(topic, slice.min(left)) {
            Ok(metadata) => return Ok(metadata),
            Err(e) => {
                // Serves the queued logs and errors that say why.
                let _ = consumer.poll(Duration::from_millis(20));
                if consumer.context().fatal().is_some() {
                    return Err(consumer.context().explain(&e));
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "no answer within {} s: {}",
                        timeout.as_secs_f64(),
                        consumer.context().explain(&e)
                    ));
                }
            }
        }
        slice = (slice * 2).min(METADATA_SLICE_MAX);
    }
}

/// Options naming files librdkafka reads when a client is created. It reports a missing one
/// without its path (`ssl.ca.location failed: error:05880002:x509 certificate
/// routines::system lib`).
const FILE_OPTIONS: [(&str, &str); 6] = [
    (
        "ssl.ca.location",
        "the CA certificate(s), PEM, that signed the brokers' certificates",
    ),
    ("ssl.certificate.location", "the client's certificate, PEM"),
    ("ssl.key.location", "the client's private key, PEM"),
    ("ssl.keystore.location", "the client's keystore, PKCS#12"),
    ("ssl.crl.location", "a certificate revocation list"),
    ("sasl.kerberos.keytab", "a Kerberos keytab"),
];

/// Every file the client `options` name exists, or an error naming the option and the path.
pub fn check_files(options: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, expected) in FILE_OPTIONS {
        let Some(path) = options.get(key) else {
            continue;
        };
        // librdkafka's own value: the system's CA store.
        if key == "ssl.ca.location" && path == "probe" {
            continue;
        }
        if !std::path::Path::new(path).exists() {
            return Err(format!(
                "options.\"{key}\": no file or directory at `{path}` (expected {expected})"
            ));
        }
    }
    Ok(())
}

/// A client creation error, with the path of the file option it names, if any
/// (`ssl.ca.location failed: … PEM lib`: a file that is there but unreadable).
pub fn creation_error(options: &BTreeMap<String, String>, e: &KafkaError) -> String {
    let text = e.to_string();
    let named = FILE_OPTIONS
        .iter()
        .find_map(|(key, _)| Some((key, options.get(*key)?)).filter(|_| text.contains(key)));
    match named {
        Some((key, path)) => format!("{text} ({key}: `{path}`)"),
        None => text,
    }
}

/// A Kafka sink's producer configuration (its brokers and options over the sink's defaults).
pub(super) fn sink_producer_config(config: &KafkaSinkConfig) -> ClientConfig {
    client_config(&config.brokers, &config.options, Role::SinkProducer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_partition_is_told_apart_from_real_errors() {
        use rdkafka::error::RDKafkaErrorCode;
        assert!(is_partition_eof(&KafkaError::PartitionEOF(3)));
        assert!(is_partition_eof(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::PartitionEOF
        )));
        assert!(!is_partition_eof(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
    }

    #[test]
    fn client_errors_name_their_likely_cause() {
        let d = Diagnosed::default();
        d.error(
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed during authentication due to \
             invalid credentials with SASL mechanism SCRAM-SHA-512",
        );
        d.error(
            KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        let text = d.explain(&"metadata timed out");
        assert!(text.starts_with("authentication failed"), "{text}");
        assert!(text.contains("invalid credentials"), "{text}");
        assert!(
            !text.contains("brokers are down"),
            "the first error only: {text}"
        );
        let none = Diagnosed::default().explain(&"Broker transport failure");
        assert!(none.starts_with("the brokers are unreachable"), "{none}");
        assert!(likely_cause("SSL handshake failed").starts_with("the TLS"));
    }

    /// librdkafka's own lines (2.12, against scripts/kafka.sh's SASL_SSL listener).
    #[test]
    fn sasl_mechanisms_credentials_and_tls_are_told_apart() {
        let mechanism = "[thrd:sasl_ssl://127.0.0.1:19093/bootstrap]: \
            sasl_ssl://127.0.0.1:19093/bootstrap: SASL SCRAM-SHA-256 mechanism handshake \
            failed: Broker: Unsupported SASL mechanism: broker's supported mechanisms: \
            SCRAM-SHA-512,PLAIN (after 302ms in state AUTH_HANDSHAKE)";
        assert!(
            likely_cause(mechanism).starts_with("the brokers do not offer this SASL mechanism"),
            "not a TLS hint: {}",
            likely_cause(mechanism)
        );
        let password = "sasl_ssl://127.0.0.1:19093/bootstrap: SASL authentication error: \
            Authentication failed during authentication due to invalid credentials with SASL \
            mechanism SCRAM-SHA-512 (after 311ms in state AUTH_REQ)";
        assert!(likely_cause(password).starts_with("authentication failed"));
        let ca = "sasl_ssl://127.0.0.1:19093/bootstrap: SSL handshake failed: \
            error:0A000086:SSL routines::certificate verify failed";
        assert!(likely_cause(ca).starts_with("the TLS connection failed"));
        // The protocol in a broker's name is not what failed.
        let refused = "sasl_ssl://127.0.0.1:19093/bootstrap: Connect to ipv4#127.0.0.1:19093 \
            failed: Connection refused (after 0ms in state CONNECT)";
        assert!(likely_cause(refused).starts_with("the brokers are unreachable"));
        for (detail, fatal) in [
            (mechanism, true),
            (password, true),
            (ca, true),
            (refused, false),
            (
                "Disconnected while requesting ApiVersion: might be caused by incorrect \
              security.protocol configuration (connecting to a SSL listener?)",
                false,
            ),
        ] {
            assert_eq!(Cause::is_fatal(detail), fatal, "{detail}");
        }
        // A refused connection, then wrong credentials: the credentials are the cause.
        let d = Diagnosed::default();
        d.log(RDKafkaLogLevel::Error, "FAIL", refused);
        assert_eq!(d.fatal(), None);
        d.log(RDKafkaLogLevel::Error, "FAIL", password);
        assert!(d.explain(&"timed out").starts_with("authentication failed"));
    }

    #[test]
    fn a_missing_file_option_is_named_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let options = |path: &std::path::Path| {
            BTreeMap::from([
                ("ssl.ca.location".to_string(), path.display().to_string()),
                ("security.protocol".to_string(), "SSL".to_string()),
            ])
        };
        let err = check_files(&options(&ca)).unwrap_err();
        assert!(
            err.contains("ssl.ca.location") && err.contains(&ca.display().to_string()),
            "{err}"
        );
        std::fs::write(&ca, "not a certificate").unwrap();
        assert_eq!(check_files(&options(&ca)), Ok(()));
        let probe = BTreeMap::from([("ssl.ca.location".to_string(), "probe".to_string())]);
        assert_eq!(check_files(&probe), Ok(()));
        // A file that is there but is no certificate: librdkafka's error, with the path.
        let e = client_config("127.0.0.1:9", &options(&ca), Role::Admin)
            .create::<BaseConsumer>()
            .err()
            .expect("librdkafka refuses a CA file that is no certificate");
        let text = creation_error(&options(&ca), &e);
        assert!(text.contains(&ca.display().to_string()), "{text}");
    }

    #[test]
    fn options_override_the_role_settings() {
        let options = BTreeMap::from([("acks".to_string(), "1".to_string())]);
        let c = client_config("b:9092", &options, Role::SinkProducer);
        assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(c.get("acks"), Some("1"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        let c = client_config(
            "b:9092",
            &BTreeMap::new(),
            Role::SourceConsumer {
                topic: "t",
                partition_eof: true,
                statistics: false,
            },
        );
        assert_eq!(c.get("group.id"), Some("riffle-t"));
        assert_eq!(c.get("enable.partition.eof"), Some("true"));
        assert_eq!(c.get("statistics.interval.ms"), None);
    }

    /// librdkafka is built with OpenSSL (SASL_SSL, SCRAM) and zstd (rdkafka features `ssl` and
    /// `zstd`): without them these settings are refused when the client is configured or made.
    #[test]
    fn librdkafka_accepts_sasl_ssl_scram_zstd_and_lz4() {
        use rdkafka::producer::BaseProducer;
        for compression in ["zstd", "lz4"] {
            let options: BTreeMap<String, String> = [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanisms", "SCRAM-SHA-512"),
                ("sasl.username", "riffle"),
                ("sasl.password", "not-a-secret"),
                ("compression.type", compression),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            // No broker listens there; creating a client does not connect.
            let config = client_config("127.0.0.1:9", &options, Role::SinkProducer);
            if let Err(e) = config.create_native_config() {
                panic!("librdkafka refused the settings with {compression}: {e}");
            }
            if let Err(e) = config.create::<BaseProducer>() {
                panic!("creating a SASL_SSL producer with {compression}: {e}");
            }
        }
    }
}
