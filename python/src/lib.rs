//! `riffle._native`: the Rust side of the `riffle` Python package (python/riffle): pipelines
//! validated, run to their end, or streamed as `pyarrow.RecordBatch`es while they run.
//!
//! A run goes on in a thread of its own; the calling thread waits with the GIL released,
//! looking for Ctrl-C (`KeyboardInterrupt`) every 100 ms, which stops the run as SIGTERM does
//! the CLI's (the open epochs finish). Results cross into Python through the Arrow C data
//! interface, without a copy.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_pyarrow::ToPyArrow;
use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use riffle_dataflow::runtime::{clear_stop_request, request_stop};
use riffle_dataflow::sink::{Sink, SinkFactory};
use riffle_dataflow::DataflowResult;
use riffle_pipelines::run::{RunOutcome, Workers};
use riffle_pipelines::{PipelineError, RunError, RunOptions};

/// How often a waiting call looks for Ctrl-C.
const POLL: Duration = Duration::from_millis(100);
/// Result batches a stream holds before the pipeline waits for the reader.
const STREAM_BUFFER: usize = 16;

/// Log lines on standard error, as the CLI's (`RUST_LOG` chooses; warnings by default).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `riffle.PipelineError` (defined in Python) for a pipeline's error.
fn pipeline_error(py: Python<'_>, e: &PipelineError) -> PyErr {
    let class = py.import("riffle").and_then(|m| m.getattr("PipelineError"));
    let made = class.and_then(|c| {
        c.call1((
            e.to_string(),
            e.file.to_string_lossy().into_owned(),
            e.line,
            e.field.clone(),
            e.message.clone(),
        ))
    });
    match made {
        Ok(value) => PyErr::from_value(value),
        Err(other) => other,
    }
}

fn run_error(py: Python<'_>, e: RunError) -> PyErr {
    match &e {
        RunError::Pipeline(p) => pipeline_error(py, p),
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// What a run is given: the pipeline (`file`, or `text` named as `file`) and its overrides.
#[derive(Default)]
struct Given {
    file: PathBuf,
    text: Option<String>,
    workers: Option<usize>,
    checkpoint: Option<String>,
    output: Option<PathBuf>,
    cluster: Option<Cluster>,
}

/// A local cluster of processes: the supervisor starts `program -m riffle run …` for each
/// (`process` is `None`), or this is process `process` of one.
struct Cluster {
    processes: usize,
    process: Option<usize>,
    base_port: Option<u16>,
    program: Option<PathBuf>,
}

impl Given {
    fn options(&self) -> RunOptions {
        let mut options = RunOptions::new(&self.file).stop_on_signals(false);
        if let Some(text) = &self.text {
            options = options.text(text.clone());
        }
        match &self.checkpoint {
            Some(url) if url.contains("://") => options = options.checkpoint_url(url.clone()),
            Some(dir) => options = options.checkpoint_dir(dir),
            None => {}
        }
        if let Some(output) = &self.output {
            options = options.output(output);
        }
        if let Some(c) = &self.cluster {
            let mut spec = riffle_pipelines::run::ClusterSpec {
                processes: c.processes,
                process: c.process,
                ..Default::default()
            };
            if let Some(port) = c.base_port {
                spec.base_port = port;
            }
            options = options.cluster(spec);
            if let Some(program) = &c.program {
                options = options.program(program).program_args(["-m", "riffle"]);
            }
        }
        // After `cluster`, which replaces the whole spec.
        if let Some(n) = self.workers {
            options = options.workers(Workers::Count(n));
        }
        options
    }
}

/// Validates a pipeline: the schema after its source and after each stage, as
/// `[(name, pyarrow.Schema)]`.
#[pyfunction]
#[pyo3(signature = (file, text=None))]
fn validate<'py>(
    py: Python<'py>,
    file: PathBuf,
    text: Option<String>,
) -> PyResult<Bound<'py, PyList>> {
    init_logging();
    let loaded = py.detach(|| match &text {
        Some(text) => riffle_pipelines::load_text(&file, text, None),
        None => riffle_pipelines::load(&file, None),
    });
    let pipeline = loaded.map_err(|e| pipeline_error(py, &e))?;
    let names =
        std::iter::once("source".to_string()).chain(riffle_pipelines::plan::stage_names(&pipeline));
    let list = PyList::empty(py);
    for (name, schema) in names.zip(&pipeline.schemas) {
        list.append((name, schema.as_ref().to_pyarrow(py)?))?;
    }
    Ok(list)
}

/// Runs a pipeline to its end; the summary as a dict.
#[pyfunction]
#[pyo3(signature = (file, text=None, workers=None, checkpoint=None, output=None, processes=None, process=None, base_port=None, program=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
fn run<'py>(
    py: Python<'py>,
    file: PathBuf,
    text: Option<String>,
    workers: Option<usize>,
    checkpoint: Option<String>,
    output: Option<PathBuf>,
    processes: Option<usize>,
    process: Option<usize>,
    base_port: Option<u16>,
    program: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    init_logging();
    let cluster = match processes {
        Some(processes) if processes > 1 || process.is_some() => {
            if process.is_none() && program.is_none() {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "processes > 1 needs the program that runs each process (the interpreter)",
                ));
            }
            Some(Cluster {
                processes,
                process,
                base_port,
                program,
            })
        }
        _ => None,
    };
    let given = Given {
        file,
        text,
        workers,
        checkpoint,
        output,
        cluster,
    };
    let options = given.options();
    clear_stop_request();
    let (done, finished) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("riffle-run".into())
        .spawn(move || {
            let _ = done.send(riffle_pipelines::run(options));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("starting the run: {e}")))?;
    let outcome = wait(py, &Mutex::new(finished), thread)?;
    summary(py, outcome.map_err(|e| run_error(py, e))?)
}

/// Waits for the run's end, stopping it on Ctrl-C (then raising `KeyboardInterrupt` once it
/// has stopped).
fn wait<T: Send>(
    py: Python<'_>,
    finished: &Mutex<Receiver<T>>,
    thread: JoinHandle<()>,
) -> PyResult<T> {
    let mut interrupted: Option<PyErr> = None;
    loop {
        match py.detach(|| receive(finished)) {
            Ok(value) => {
                let _ = thread.join();
                return match interrupted {
                    Some(e) => Err(e),
                    None => Ok(value),
                };
            }
            Err(RecvTimeoutError::Timeout) => {
                if interrupted.is_none() {
                    if let Err(e) = py.check_signals() {
                        request_stop();
                        interrupted = Some(e);
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                return Err(PyRuntimeError::new_err(
                    "the run's thread ended without a word",
                ));
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summary(py: Python<'_>, outcome: RunOutcome) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("pipeline", &outcome.pipeline)?;
    dict.set_item("exit_code", outcome.exit_code())?;
    dict.set_item("stopped", outcome.stopped)?;
    dict.set_item("elapsed_s", outcome.elapsed.as_secs_f64())?;
    // A supervisor's processes print their own figures; it has the restarts.
    dict.set_item("restarts", outcome.restarts)?;
    dict.set_item(
        "too_many_dead_letters",
        outcome.dead_letters.as_ref().map(|d| d.to_string()),
    )?;
    if let Some(report) = &outcome.report {
        let s = &report.summary;
        dict.set_item("workers", report.workers)?;
        dict.set_item("results", s.results)?;
        dict.set_item("ready_p50_ms", ms(s.ready_p50))?;
        dict.set_item("ready_p99_ms", ms(s.ready_p99))?;
        dict.set_item("committed_p50_ms", ms(s.end_to_end_p50))?;
        dict.set_item("committed_p99_ms", ms(s.end_to_end_p99))?;
        dict.set_item("busy_s", s.busy.as_secs_f64())?;
        let stages = PyList::empty(py);
        for stage in &s.stages {
            let d = PyDict::new(py);
            d.set_item("name", &stage.name)?;
            d.set_item("records_in", stage.records_in)?;
            d.set_item("records_out", stage.records_out)?;
            d.set_item("dead_letters", stage.dead_letters)?;
            d.set_item("batches", stage.batches)?;
            d.set_item("p50_ms", ms(stage.p50))?;
            d.set_item("p99_ms", ms(stage.p99))?;
            stages.append(d)?;
        }
        dict.set_item("stages", stages)?;
        let reasons = PyDict::new(py);
        for (reason, n) in &s.dead_letter_reasons {
            reasons.set_item(reason, n)?;
        }
        dict.set_item("dead_letter_reasons", reasons)?;
    }
    Ok(dict)
}

/// The next message, or a timeout after [`POLL`].
fn receive<T>(receiver: &Mutex<Receiver<T>>) -> Result<T, RecvTimeoutError> {
    receiver
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .recv_timeout(POLL)
}

/// What a stream's run sends its reader.
enum Message {
    Batch(RecordBatch),
    Done(Box<Result<RunOutcome, RunError>>),
}

/// The results of a streamed run, handed to its reader as they are written (after their
/// epoch completes, as any sink's).
struct ChannelSinkFactory(SyncSender<Message>);

struct ChannelSink(SyncSender<Message>);

impl SinkFactory for ChannelSinkFactory {
    fn open(&self) -> DataflowResult<Box<dyn Sink>> {
        Ok(Box::new(ChannelSink(self.0.clone())))
    }
}

impl Sink for ChannelSink {
    fn write_batch(&mut self, batch: &RecordBatch) -> DataflowResult<()> {
        // A closed stream's reader is gone: what is left of the run is let go.
        let _ = self.0.send(Message::Batch(batch.clone()));
        Ok(())
    }

    fn flush(&mut self) -> DataflowResult<()> {
        Ok(())
    }
}

/// Results as `pyarrow.RecordBatch`es while the pipeline runs (`for batch in stream`);
/// `close()` (or leaving a `with` block) stops the run and waits for its end. The summary is
/// `summary` once the stream is exhausted or closed.
#[pyclass(module = "riffle._native")]
struct Stream {
    // In a mutex: a Python object may be touched from any thread (one at a time).
    receiver: Option<Mutex<Receiver<Message>>>,
    thread: Option<JoinHandle<()>>,
    #[pyo3(get)]
    summary: Option<Py<PyDict>>,
}

#[pyfunction]
#[pyo3(signature = (file, text=None, workers=None, checkpoint=None))]
fn stream(
    file: PathBuf,
    text: Option<String>,
    workers: Option<usize>,
    checkpoint: Option<String>,
) -> PyResult<Stream> {
    init_logging();
    let given = Given {
        file,
        text,
        workers,
        checkpoint,
        ..Default::default()
    };
    let (sender, receiver) = mpsc::sync_channel(STREAM_BUFFER);
    let options = given
        .options()
        .sink(Arc::new(ChannelSinkFactory(sender.clone())));
    clear_stop_request();
    let thread = std::thread::Builder::new()
        .name("riffle-stream".into())
        .spawn(move || {
            let outcome = riffle_pipelines::run(options);
            let _ = sender.send(Message::Done(Box::new(outcome)));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("starting the run: {e}")))?;
    Ok(Stream {
        receiver: Some(Mutex::new(receiver)),
        thread: Some(thread),
        summary: None,
    })
}

impl Stream {
    /// The run has ended with `outcome`: its thread is joined and the summary kept.
    fn end(&mut self, py: Python<'_>, outcome: Result<RunOutcome, RunError>) -> PyResult<()> {
        self.receiver = None;
        if let Some(thread) = self.thread.take() {
            py.detach(|| {
                let _ = thread.join();
            });
        }
        let outcome = outcome.map_err(|e| run_error(py, e))?;
        self.summary = Some(summary(py, outcome)?.unbind());
        Ok(())
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        loop {
            let Some(receiver) = self.receiver.as_ref() else {
                return Err(PyStopIteration::new_err(()));
            };
            match py.detach(|| receive(receiver)) {
                Ok(Message::Batch(batch)) => return Ok(batch.to_pyarrow(py)?.unbind()),
                Ok(Message::Done(outcome)) => {
                    self.end(py, *outcome)?;
                    return Err(PyStopIteration::new_err(()));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        // Ctrl-C while waiting: the run stops as on close().
                        self.close(py)?;
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.receiver = None;
                    return Err(PyRuntimeError::new_err(
                        "the run's thread ended without a word",
                    ));
                }
            }
        }
    }

    /// Stops the run (the open epochs finish, as on SIGTERM) and waits for its end; results
    /// still coming are dropped.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(receiver) = self.receiver.take() else {
            return Ok(());
        };
        request_stop();
        loop {
            match py.detach(|| receive(&receiver)) {
                Ok(Message::Batch(_)) | Err(RecvTimeoutError::Timeout) => {}
                Ok(Message::Done(outcome)) => return self.end(py, *outcome),
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _args: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(stream, m)?)?;
    m.add_class::<Stream>()?;
    Ok(())
}
