//! Protobuf schemas: loading descriptors (`.proto` files, descriptor sets, registered schemas),
//! their Arrow schema, and the compatibility of a writer's message with a reader's.
//!
//! - `mapping.rs`: the Arrow type of each protobuf type (`Shape`).
//! - `compat.rs`: whether a writer's message reads as the reader's, field by field.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use prost_reflect::{DescriptorPool, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use protox::Compiler;

use super::ProtoFormatError;
use crate::schema_registry::{RegisteredSchema, SchemaType};

mod compat;
mod mapping;

pub(super) use compat::{first_conflict, message_at};
pub(super) use mapping::{shape, Shape};

use mapping::message_fields;

/// Time zone of `google.protobuf.Timestamp` columns: UTC as an offset, which Arrow parses
/// without chrono-tz (`"UTC"` would not).
pub(super) const UTC: &str = "+00:00";

/// The entries field of a map column.
pub(super) fn map_entries(key: DataType, value: DataType) -> Arc<Field> {
    Arc::new(Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("key", key, false),
            Field::new("value", value, false),
        ])),
        false,
    ))
}

/// A message type and the descriptor pool it lives in, with its Arrow schema.
#[derive(Clone)]
pub struct ProtoSchema {
    message: MessageDescriptor,
    /// The `.proto` text the message was compiled from, for registering it.
    source: Option<Arc<str>>,
    arrow: SchemaRef,
}

impl fmt::Debug for ProtoSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtoSchema")
            .field("message", &self.message.full_name())
            .field("file", &self.message.parent_file().name())
            .finish_non_exhaustive()
    }
}

impl ProtoSchema {
    /// `message` (a full name, or a name unique among the messages) of a `FileDescriptorSet`
    /// file, as `protoc --include_imports -o x.desc` writes.
    pub fn from_descriptor_set(path: &Path, message: &str) -> Result<Self, ProtoFormatError> {
        let bytes = std::fs::read(path).map_err(|cause| ProtoFormatError::Read {
            path: path.to_owned(),
            cause,
        })?;
        let file = path.display().to_string();
        let pool = DescriptorPool::decode(bytes.as_slice()).map_err(|e| ProtoFormatError::Schema {
            file: file.clone(),
            what: format!(
                "not a FileDescriptorSet holding its imports (as `protoc --include_imports -o FILE` writes): {e}"
            ),
        })?;
        let scope: Vec<MessageDescriptor> = pool
            .files()
            .filter(|f| !f.package_name().starts_with("google.protobuf"))
            .flat_map(|f| file_messages(&f))
            .collect();
        let message = find_message(&pool, &scope, message, &file)?;
        Self::new(message, None)
    }

    /// `message` of a `.proto` file, compiled in-process. Imports are looked up in `includes`
    /// (the file's directory when empty, and after them when the file is under none of them),
    /// then among protobuf's well-known types (`google/protobuf/timestamp.proto`, …).
    pub fn from_proto_file(
        path: &Path,
        includes: &[PathBuf],
        message: &str,
    ) -> Result<Self, ProtoFormatError> {
        let source = std::fs::read_to_string(path).map_err(|cause| ProtoFormatError::Read {
            path: path.to_owned(),
            cause,
        })?;
        let file = path.display().to_string();
        let canonical = path
            .canonicalize()
            .map_err(|cause| ProtoFormatError::Read {
                path: path.to_owned(),
                cause,
            })?;
        let mut dirs = Vec::with_capacity(includes.len() + 1);
        for include in includes {
            dirs.push(
                include
                    .canonicalize()
                    .map_err(|cause| ProtoFormatError::Schema {
                        file: file.clone(),
                        what: format!("include directory {}: {cause}", include.display()),
                    })?,
            );
        }
        if !dirs.iter().any(|d| canonical.starts_with(d)) {
            if let Some(parent) = canonical.parent() {
                dirs.push(parent.to_owned());
            }
        }
        let compile_error = |e: protox::Error| ProtoFormatError::Schema {
            file: file.clone(),
            // protox's Debug form carries the file, line and column.
            what: format!("does not compile: {e:?}"),
        };
        let mut compiler = Compiler::new(&dirs).map_err(compile_error)?;
        compiler.include_imports(true);
        compiler.open_file(&canonical).map_err(compile_error)?;
        let pool = compiler.descriptor_pool();
        let main = compiler
            .files()
            .filter(|f| !f.is_import())
            .find_map(|f| pool.get_file_by_name(f.name()))
            .ok_or_else(|| ProtoFormatError::Schema {
                file: file.clone(),
                what: "compiled to no file".into(),
            })?;
        let message = find_message(&pool, &file_messages(&main), message, &file)?;
        Self::new(message, Some(source.into()))
    }

    /// `message` of a schema registry's `.proto` text, its `references` (the imports, by the
    /// names it imports them by, as [`SchemaLookup::references`] lists them) given as in-memory
    /// files. `message` `None` is the first message of the file.
    ///
    /// [`SchemaLookup::references`]: crate::schema_registry::SchemaLookup::references
    pub fn from_registered(
        schema: &RegisteredSchema,
        references: &[(String, Arc<RegisteredSchema>)],
        message: Option<&str>,
    ) -> Result<Self, ProtoFormatError> {
        let file = format!("registered schema id {}", schema.id);
        let (pool, main) = compile_registered(schema, references)?;
        let scope = file_messages(&main);
        let message = match message {
            Some(name) => find_message(&pool, &scope, name, &file)?,
            None => main
                .messages()
                .next()
                .ok_or_else(|| ProtoFormatError::MessageNotFound {
                    message: "(the first message)".into(),
                    file: file.clone(),
                    defined: "no messages".into(),
                })?,
        };
        Self::new(message, Some(schema.schema.as_str().into()))
    }

    fn new(message: MessageDescriptor, source: Option<Arc<str>>) -> Result<Self, ProtoFormatError> {
        let fields = message_fields(&message, &mut Vec::new())?;
        Ok(ProtoSchema {
            message,
            source,
            arrow: Arc::new(Schema::new(fields)),
        })
    }

    /// The message's full name (`package.Outer.Inner`).
    pub fn message_name(&self) -> &str {
        self.message.full_name()
    }

    /// The message's path in its file, as the Confluent framing writes it: the index of its
    /// top-level message, then of each nested one.
    pub fn message_indexes(&self) -> Vec<i32> {
        // A message's source path alternates field tags of the descriptor protos (4:
        // `message_type`, 3: `nested_type`) with indexes.
        self.message
            .path()
            .iter()
            .skip(1)
            .step_by(2)
            .copied()
            .collect()
    }

    /// The columns messages decode into (see the module documentation for the mapping).
    pub fn arrow_schema(&self) -> SchemaRef {
        self.arrow.clone()
    }

    /// The `.proto` source text, when compiled from one (for registering it).
    pub fn proto_text(&self) -> Option<&str> {
        self.source.as_deref()
    }

    pub(super) fn descriptor(&self) -> &MessageDescriptor {
        &self.message
    }
}

/// In-memory `.proto` files by import name.
struct Sources(HashMap<String, String>);

impl FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(source) => File::from_source(name, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// Compiles a registered `.proto` text with its references; the pool and the schema's own file.
pub(super) fn compile_registered(
    schema: &RegisteredSchema,
    references: &[(String, Arc<RegisteredSchema>)],
) -> Result<(DescriptorPool, FileDescriptor), ProtoFormatError> {
    let file = format!("registered schema id {}", schema.id);
    if schema.schema_type != SchemaType::Protobuf {
        return Err(ProtoFormatError::Schema {
            file,
            what: format!(
                "is a {} schema, expected PROTOBUF",
                schema_type_name(schema.schema_type)
            ),
        });
    }
    // A name no import can take: references are named by their import paths.
    let main = format!("registered-schema-{}.proto", schema.id);
    let mut sources: HashMap<String, String> = references
        .iter()
        .map(|(name, reference)| (name.clone(), reference.schema.clone()))
        .collect();
    sources.insert(main.clone(), schema.schema.clone());
    let mut resolver = ChainFileResolver::new();
    resolver.add(Sources(sources));
    resolver.add(GoogleFileResolver::new());
    let mut compiler = Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    compiler
        .open_file(&main)
        .map_err(|e| ProtoFormatError::Schema {
            file: file.clone(),
            what: format!("does not compile: {e:?}"),
        })?;
    let pool = compiler.descriptor_pool();
    let main = pool
        .get_file_by_name(&main)
        .ok_or_else(|| ProtoFormatError::Schema {
            file,
            what: "compiled to no file".into(),
        })?;
    Ok((pool, main))
}

/// The name the registry gives a schema type.
pub(super) fn schema_type_name(schema_type: SchemaType) -> &'static str {
    match schema_type {
        SchemaType::Avro => "AVRO",
        SchemaType::Protobuf => "PROTOBUF",
        SchemaType::Json => "JSON",
    }
}

/// The messages of `file`, nested ones included, map entries left out.
fn file_messages(file: &FileDescriptor) -> Vec<MessageDescriptor> {
    fn walk(message: MessageDescriptor, out: &mut Vec<MessageDescriptor>) {
        if message.is_map_entry() {
            return;
        }
        let children: Vec<MessageDescriptor> = message.child_messages().collect();
        out.push(message);
        for child in children {
            walk(child, out);
        }
    }
    let mut out = Vec::new();
    for message in file.messages() {
        walk(message, &mut out);
    }
    out
}

/// The message named `name`: a full name in `pool`, or the one message of `scope` whose name
/// (or the end of its full name) is `name`.
fn find_message(
    pool: &DescriptorPool,
    scope: &[MessageDescriptor],
    name: &str,
    file: &str,
) -> Result<MessageDescriptor, ProtoFormatError> {
    let name = name.trim_start_matches('.');
    if let Some(message) = pool.get_message_by_name(name) {
        return Ok(message);
    }
    let suffix = format!(".{name}");
    let matches: Vec<&MessageDescriptor> = scope
        .iter()
        .filter(|m| m.full_name().ends_with(&suffix))
        .collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(ProtoFormatError::MessageNotFound {
            message: name.to_owned(),
            file: file.to_owned(),
            defined: if scope.is_empty() {
                "no messages".into()
            } else {
                names(scope.iter())
            },
        }),
        several => Err(ProtoFormatError::MessageNotFound {
            message: name.to_owned(),
            file: file.to_owned(),
            defined: format!(
                "several that match, give the full name of one: {}",
                names(several.iter().copied())
            ),
        }),
    }
}

fn names<'a>(messages: impl Iterator<Item = &'a MessageDescriptor>) -> String {
    messages
        .map(|m| m.full_name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The fields of `message` in declaration order (prost-reflect lists them by number).
pub(super) fn declared_fields(message: &MessageDescriptor) -> Vec<FieldDescriptor> {
    message
        .descriptor_proto()
        .field
        .iter()
        .filter_map(|f| u32::try_from(f.number()).ok())
        .filter_map(|number| message.get_field(number))
        .collect()
}

/// The protobuf name of a field's type, for messages.
pub(super) fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => format!("message {}", m.full_name()),
        Kind::Enum(e) => format!("enum {}", e.full_name()),
    }
}
