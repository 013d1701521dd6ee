//! The schemas a schema references, resolved transitively through the client's cache.

use std::collections::HashSet;
use std::sync::Arc;

use super::RegistryClient;
use crate::schema_registry::{RegisteredSchema, RegistryError, SchemaLookup, SchemaReference};

impl SchemaLookup for RegistryClient {
    fn by_id(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        RegistryClient::by_id(self, id)
    }

    /// Resolves references through [`RegistryClient::version`], depth first: dependencies
    /// before dependents, each (subject, version) and each name once, cycles cut.
    fn references(
        &self,
        schema: &RegisteredSchema,
    ) -> Result<Vec<(String, Arc<RegisteredSchema>)>, RegistryError> {
        let mut walk = Walk::default();
        if let (Some(subject), Some(version)) = (&schema.subject, schema.version) {
            walk.visiting.insert((subject.clone(), version));
        }
        for reference in &schema.references {
            self.visit(reference, &mut walk)?;
        }
        Ok(walk.out)
    }
}

/// The state of a reference walk.
#[derive(Default)]
struct Walk {
    out: Vec<(String, Arc<RegisteredSchema>)>,
    done: HashSet<(String, i32)>,
    visiting: HashSet<(String, i32)>,
    names: HashSet<String>,
}

impl RegistryClient {
    fn visit(&self, reference: &SchemaReference, walk: &mut Walk) -> Result<(), RegistryError> {
        let key = (reference.subject.clone(), reference.version);
        // Already emitted, or on the current path (a cycle): cut here.
        if walk.done.contains(&key) || !walk.visiting.insert(key.clone()) {
            return Ok(());
        }
        let schema = self.version(&reference.subject, reference.version)?;
        for child in &schema.references {
            self.visit(child, walk)?;
        }
        walk.visiting.remove(&key);
        walk.done.insert(key);
        if walk.names.insert(reference.name.clone()) {
            walk.out.push((reference.name.clone(), schema));
        } else {
            tracing::warn!(
                name = %reference.name,
                subject = %reference.subject,
                version = reference.version,
                "schema reference name already resolved to another schema; keeping the first"
            );
        }
        Ok(())
    }
}
