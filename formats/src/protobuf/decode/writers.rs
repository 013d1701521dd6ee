//! Writer schemas named by the Confluent framing: fetched once each, judged against the
//! reader's message per message path, the verdicts shared by the decoder's clones.

use std::collections::HashMap;
use std::sync::PoisonError;

use prost_reflect::FileDescriptor;

use super::{ProtobufDecoder, Session};
use crate::protobuf::schema::{compile_registered, first_conflict, message_at, schema_type_name};
use crate::schema_registry::{RegistryError, SchemaLookup, SchemaType};

/// A writer schema, once fetched.
pub(super) enum Writer {
    /// It compiled: the verdict for each message path seen so far.
    File {
        file: FileDescriptor,
        verdicts: HashMap<Vec<i32>, Result<(), String>>,
    },
    /// It never will be read (not Protobuf, does not compile): the reason.
    Refused(String),
}

impl ProtobufDecoder {
    /// Whether payloads of writer schema `id`, message `indexes`, read as the reader's message.
    pub(super) fn check_writer(
        &self,
        writers: &dyn SchemaLookup,
        id: u32,
        indexes: &[i32],
        session: &mut Session,
    ) -> Result<(), String> {
        if session
            .last_ok
            .as_ref()
            .is_some_and(|(ok_id, ok_indexes)| *ok_id == id && ok_indexes == indexes)
        {
            return Ok(());
        }
        if let Some(reason) = session.failed.get(&id) {
            return Err(reason.clone());
        }
        let cached = {
            let checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
            match checked.get(&id) {
                Some(Writer::Refused(reason)) => return Err(reason.clone()),
                Some(Writer::File { file, verdicts }) => match verdicts.get(indexes) {
                    Some(verdict) => Some(Ok(verdict.clone())),
                    None => Some(Err(file.clone())),
                },
                None => None,
            }
        };
        let verdict = match cached {
            Some(Ok(verdict)) => verdict,
            Some(Err(file)) => self.remember(id, file, indexes),
            // Fetched without holding the lock: other clones keep decoding meanwhile.
            None => match fetch_writer(writers, id) {
                Ok(file) => self.remember(id, file, indexes),
                Err(Fetched::Refused(reason)) => {
                    self.checked
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(id, Writer::Refused(reason.clone()));
                    Err(reason)
                }
                Err(Fetched::Failed(reason)) => {
                    session.failed.insert(id, reason.clone());
                    Err(reason)
                }
            },
        };
        if verdict.is_ok() {
            session.last_ok = Some((id, indexes.to_vec()));
        }
        verdict
    }

    /// Judges message `indexes` of writer `id`'s `file` against the reader, and keeps the verdict.
    fn remember(&self, id: u32, file: FileDescriptor, indexes: &[i32]) -> Result<(), String> {
        let reader = self.reader.descriptor();
        let verdict = match message_at(&file, indexes) {
            None => Err(format!(
                "writer schema id {id}: the payload's message indexes {indexes:?} name no message of the schema"
            )),
            Some(writer) if writer.full_name() != reader.full_name() => Err(format!(
                "writer schema id {id} wrote message `{}`, not the reader's `{}`",
                writer.full_name(),
                reader.full_name()
            )),
            Some(writer) => match first_conflict(&writer, reader) {
                Some(conflict) => Err(format!(
                    "writer schema id {id} is incompatible with the reader's `{}`: {conflict}",
                    reader.full_name()
                )),
                None => Ok(()),
            },
        };
        let mut checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
        match checked.entry(id).or_insert_with(|| Writer::File {
            file,
            verdicts: HashMap::new(),
        }) {
            Writer::File { verdicts, .. } => {
                verdicts.insert(indexes.to_vec(), verdict.clone());
            }
            Writer::Refused(_) => {}
        }
        verdict
    }
}

enum Fetched {
    /// The schema will never be read (kept).
    Refused(String),
    /// The registry did not answer (asked again later).
    Failed(String),
}

fn fetch_writer(writers: &dyn SchemaLookup, id: u32) -> Result<FileDescriptor, Fetched> {
    // Only an unreachable registry is worth asking again; its other answers are final.
    let failed = |e: RegistryError| match e {
        RegistryError::Request { .. } => Fetched::Failed(format!("writer schema id {id}: {e}")),
        _ => Fetched::Refused(format!("writer schema id {id}: {e}")),
    };
    let schema = writers.by_id(id).map_err(failed)?;
    if schema.schema_type != SchemaType::Protobuf {
        return Err(Fetched::Refused(format!(
            "writer schema id {id} is a {} schema, not PROTOBUF",
            schema_type_name(schema.schema_type)
        )));
    }
    let references = writers.references(&schema).map_err(failed)?;
    compile_registered(&schema, &references)
        .map(|(_, file)| file)
        .map_err(|e| Fetched::Refused(format!("writer schema id {id}: {e}")))
}
