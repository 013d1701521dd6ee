//! `/api/cameras`: the source's inputs listed, added and removed while the run goes on
//! ([`InputControl`]), on process 0's view or metrics address.
//!
//! - `GET /api/cameras`: the cameras, with their index, worker and origin;
//! - `POST /api/cameras` with a JSON camera (`{"id": "door", "uri": "rtsp://…"}`): 201 and the
//!   camera as placed; 400 (malformed, unknown key, missing file), 409 (id taken, or a source
//!   that ends with its cameras), each with the reason and nothing changed;
//! - `DELETE /api/cameras/{id}`: 200 and the camera removed, 404 when there is none.
//!
//! On an address other than loopback every request needs `Authorization: Bearer <token>`
//! (`source.video.api_token`); without a token configured such an address refuses them all.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::Router;
use riffle_dataflow::control::{ControlError, InputControl};
use serde_json::{json, Value};

#[derive(Clone)]
struct Control {
    inputs: Arc<dyn InputControl>,
    /// The server listens on loopback only: requests need no token unless one is set.
    loopback: bool,
}

/// The routes for `inputs`, for a server bound to a loopback address or not.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(
    inputs: Arc<dyn InputControl>,
    loopback: bool,
) -> Router<S> {
    let path = format!("/api/{}", inputs.noun());
    Router::new()
        .route(&path, get(list).post(add))
        .route(&format!("{path}/{{id}}"), delete(remove))
        .with_state(Control { inputs, loopback })
}

fn answer(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

fn refused(e: &ControlError) -> Response {
    let status = match e {
        ControlError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ControlError::NotFound(_) => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
    };
    answer(status, json!({ "error": e.to_string() }))
}

/// `None` when the request may go on, else the refusal.
fn unauthorised(control: &Control, headers: &HeaderMap) -> Option<Response> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match (control.inputs.token(), given) {
        (Some(token), Some(given)) if constant_time_eq(token.as_bytes(), given.as_bytes()) => None,
        (Some(_), _) => Some(answer(
            StatusCode::UNAUTHORIZED,
            json!({ "error": "give the API token as `Authorization: Bearer <token>`" }),
        )),
        (None, _) if control.loopback => None,
        (None, _) => Some(answer(
            StatusCode::FORBIDDEN,
            json!({ "error": "this address is not loopback: changes need a token; set \
                    `source.video.api_token: ${VAR}` and send it as `Authorization: Bearer`" }),
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn list(State(control): State<Control>, headers: HeaderMap) -> Response {
    if let Some(no) = unauthorised(&control, &headers) {
        return no;
    }
    answer(StatusCode::OK, control.inputs.list())
}

async fn add(State(control): State<Control>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(no) = unauthorised(&control, &headers) {
        return no;
    }
    let spec: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return refused(&ControlError::BadRequest(
                "expected a JSON object: {\"id\": …, \"uri\": …}".into(),
            ))
        }
        Err(e) => return refused(&ControlError::BadRequest(format!("not JSON: {e}"))),
    };
    match control.inputs.add(spec) {
        Ok(added) => answer(StatusCode::CREATED, added),
        Err(e) => refused(&e),
    }
}

async fn remove(
    State(control): State<Control>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(no) = unauthorised(&control, &headers) {
        return no;
    }
    match control.inputs.remove(&id) {
        Ok(removed) => answer(StatusCode::OK, removed),
        Err(e) => refused(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Option<String>);

    impl InputControl for Fixed {
        fn noun(&self) -> &'static str {
            "cameras"
        }
        fn list(&self) -> Value {
            json!([])
        }
        fn add(&self, _: Value) -> Result<Value, ControlError> {
            Ok(json!({}))
        }
        fn remove(&self, id: &str) -> Result<Value, ControlError> {
            Err(ControlError::NotFound(id.into()))
        }
        fn keep_open(&self) {}
        fn token(&self) -> Option<String> {
            self.0.clone()
        }
        fn snapshot(&self) -> Value {
            Value::Null
        }
        fn apply(&self, _: &Value) -> Result<(), ControlError> {
            Ok(())
        }
    }

    fn check(token: Option<&str>, loopback: bool, given: Option<&str>) -> Option<StatusCode> {
        let control = Control {
            inputs: Arc::new(Fixed(token.map(str::to_string))),
            loopback,
        };
        let mut headers = HeaderMap::new();
        if let Some(g) = given {
            headers.insert(
                header::AUTHORIZATION,
                format!("Bearer {g}").parse().unwrap(),
            );
        }
        unauthorised(&control, &headers).map(|r| r.status())
    }

    #[test]
    fn a_token_is_needed_off_loopback_and_checked_when_set() {
        assert_eq!(check(None, true, None), None);
        assert_eq!(check(None, false, None), Some(StatusCode::FORBIDDEN));
        assert_eq!(check(None, false, Some("x")), Some(StatusCode::FORBIDDEN));
        assert_eq!(check(Some("s3cret"), false, Some("s3cret")), None);
        assert_eq!(
            check(Some("s3cret"), false, Some("s3cre")),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            check(Some("s3cret"), true, None),
            Some(StatusCode::UNAUTHORIZED)
        );
    }
}
