//! Stage kinds left out of a build (a cargo feature off, for a quicker first build): the
//! block parses to an error naming the feature, so a pipeline that needs the kind fails at
//! validation, with the place in the file, never at run time.
#![cfg_attr(feature = "python", allow(dead_code))]

use arrow_schema::SchemaRef;
use riffle_dataflow::runtime::Step;
use riffle_dataflow::{DataflowError, DataflowResult};
use riffle_operators::{StageContext, StageKind};

fn python_why() -> String {
    riffle_connectors::kind::not_built("python", "python")
}

/// The `python:` stage without the `python` feature (no embedded interpreter).
#[derive(Clone, Debug)]
pub struct UnbuiltPython;

impl<'de> serde::Deserialize<'de> for UnbuiltPython {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Err(serde::de::Error::custom(python_why()))
    }
}

impl StageKind for UnbuiltPython {
    fn kind(&self) -> &'static str {
        "python"
    }
    fn output_schema(&self, _input: &SchemaRef) -> DataflowResult<SchemaRef> {
        Err(DataflowError::Config(python_why()))
    }
    fn build(&self, _ctx: &StageContext<'_>) -> DataflowResult<Step> {
        Err(DataflowError::Config(python_why()))
    }
}
