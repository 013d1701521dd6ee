//! `share: process`: one model instance (one ONNX Runtime session, or one dense executor) per
//! process, serving every worker of the process. Each worker's stage sends its batch to the
//! model's own thread and waits for the result; that thread runs whatever the workers have
//! sent meanwhile as one model batch (up to `batch.max_size` rows), so batches are merged
//! across workers as well as across a worker's own inputs: DeepStream's stream-muxer, across
//! threads. Memory is one copy of the weights and arena instead of one per worker.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, Weak};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use riffle_dataflow::{DataflowError, DataflowResult, Stage, StageOutput};

use super::{output_schema, Model, ModelConfig, Signature};

/// One worker's request: its batch, and where to send the result.
struct Request {
    batch: RecordBatch,
    reply: SyncSender<DataflowResult<RecordBatch>>,
}

/// The process's served models, by what makes two stages share one: the same file, engine
/// settings and batch size. Entries die with their last stage.
static SERVERS: Mutex<Option<HashMap<String, Weak<Server>>>> = Mutex::new(None);

/// A model served by its own thread.
pub(crate) struct Server {
    requests: Mutex<Option<SyncSender<Request>>>,
    signature: Signature,
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered what is queued.
        if let Ok(mut sender) = self.requests.lock() {
            sender.take();
        }
    }
}

impl Server {
    /// The server for `config` in this process: started on first use by loading the model
    /// with `load` (on the first worker that asks), shared by every later stage asking for the
    /// same model.
    pub(crate) fn for_process(
        config: &ModelConfig,
        engine: &str,
        max_rows: usize,
        load: impl FnOnce() -> DataflowResult<Model>,
    ) -> DataflowResult<Arc<Server>> {
        let key = format!(
            "{}|{engine}|{:?}|{}",
            config.path.display(),
            config.intra_op_threads,
            config.batch.max_size
        );
        let mut servers = SERVERS.lock().unwrap_or_else(|p| p.into_inner());
        let servers = servers.get_or_insert_with(HashMap::new);
        if let Some(server) = servers.get(&key).and_then(Weak::upgrade) {
            return Ok(server);
        }
        let model = load()?;
        let max_rows = max_rows.max(1);
        let signature = model.signature().clone();
        // Room for one waiting request per worker thread is plenty: senders block otherwise.
        let (tx, rx) = mpsc::sync_channel::<Request>(64);
        std::thread::Builder::new()
            .name("riffle-model".into())
            .spawn(move || serve(model, rx, max_rows))
            .map_err(|e| DataflowError::stage("model", format!("starting its thread: {e}")))?;
        let server = Arc::new(Server {
            requests: Mutex::new(Some(tx)),
            signature,
        });
        servers.insert(key, Arc::downgrade(&server));
        Ok(server)
    }

    fn call(&self, batch: RecordBatch) -> DataflowResult<RecordBatch> {
        let (reply, answer) = mpsc::sync_channel(1);
        let sender = self
            .requests
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .ok_or_else(|| DataflowError::stage("model", "the shared model has stopped"))?;
        sender
            .send(Request { batch, reply })
            .map_err(|_| DataflowError::stage("model", "the shared model's thread has ended"))?;
        answer
            .recv()
            .map_err(|_| DataflowError::stage("model", "the shared model's thread has ended"))?
    }
}

/// The model thread: takes the first waiting request, adds whatever else is already waiting
/// (up to `max_rows` rows, same schema), runs them as one batch and answers each with its rows.
fn serve(mut model: Model, requests: Receiver<Request>, max_rows: usize) {
    let mut held: Option<Request> = None;
    loop {
        let first = match held.take() {
            Some(r) => r,
            None => match requests.recv() {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        let schema = first.batch.schema();
        let mut rows = first.batch.num_rows();
        let mut group = vec![first];
        while rows < max_rows {
            match requests.try_recv() {
                Ok(r) if r.batch.schema() == schema && rows + r.batch.num_rows() <= max_rows => {
                    rows += r.batch.num_rows();
                    group.push(r);
                }
                Ok(r) => {
                    held = Some(r);
                    break;
                }
                Err(_) => break,
            }
        }
        run_group(&mut model, group, &schema);
    }
}

fn run_group(model: &mut Model, group: Vec<Request>, schema: &SchemaRef) {
    if group.len() == 1 {
        for r in group {
            let out = model.process_batch(&r.batch).map(|o| o.records);
            let _ = r.reply.send(out);
        }
        return;
    }
    let batches: Vec<RecordBatch> = group.iter().map(|r| r.batch.clone()).collect();
    let merged = arrow_select::concat::concat_batches(schema, &batches)
        .map_err(DataflowError::from)
        .and_then(|b| model.process_batch(&b));
    match merged {
        Ok(out) => {
            let mut offset = 0;
            for r in group {
                let n = r.batch.num_rows();
                let _ = r.reply.send(Ok(out.records.slice(offset, n)));
                offset += n;
            }
        }
        // One worker's bad rows must not fail another's: each batch runs alone again, so the
        // error reaches the worker it belongs to.
        Err(_) => {
            for r in group {
                let out = model.process_batch(&r.batch).map(|o| o.records);
                let _ = r.reply.send(out);
            }
        }
    }
}

/// A worker's side of a shared model: the stage it runs.
pub struct SharedModel {
    config: ModelConfig,
    server: Arc<Server>,
}

impl SharedModel {
    pub(crate) fn new(config: ModelConfig, server: Arc<Server>) -> Self {
        SharedModel { config, server }
    }
}

impl Stage for SharedModel {
    fn name(&self) -> &str {
        "model"
    }

    fn preserves_rows(&self) -> bool {
        true
    }

    fn output_schema(&self, input: &SchemaRef) -> DataflowResult<SchemaRef> {
        output_schema(&self.config, &self.server.signature, input)
    }

    fn process_batch(&mut self, batch: &RecordBatch) -> DataflowResult<StageOutput> {
        self.server.call(batch.clone()).map(StageOutput::all)
    }
}
