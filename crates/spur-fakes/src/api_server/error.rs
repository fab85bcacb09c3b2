//! API errors, answered as `Status` objects the way a real API server words them.

use serde_json::{Value, json};

/// A failed API call: an HTTP code, a Kubernetes `reason` and a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...), as in `metav1.StatusReason`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details.name`, `details.group` and `details.kind` of the object concerned.
    pub details: Option<(String, String, String)>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, name: &str, group: &str, plural: &str) -> Self {
        self.details = Some((name.to_owned(), group.to_owned(), plural.to_owned()));
        self
    }

    /// 404 for a missing object; `resource` is the group-qualified plural (`spurjobs.spur.amd.com`).
    pub fn not_found(resource: &str, group: &str, plural: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
            .with_details(name, group, plural)
    }

    /// 404 for a path that names no served resource.
    pub fn unknown_path(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 on create of an existing name.
    pub fn already_exists(resource: &str, group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        )
        .with_details(name, group, plural)
    }

    /// 409 on a failed resourceVersion or uid precondition.
    pub fn conflict(resource: &str, group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        )
        .with_details(name, group, plural)
    }

    /// 400 for a request the server cannot make sense of.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 for a well-formed request whose result is not acceptable.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 415 for a body in a content type the verb does not take.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format ({content_type:?})"),
        )
    }

    /// 405 for a verb a path does not serve.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 410 for a resourceVersion older than the kept history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 401 for a request without a token the server knows.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 for a request the authorizer refused, `why` worded as Kubernetes words it
    /// (`User "u" cannot get resource ...`); `resource` is the plural without subresource.
    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = match (resource, group) {
            ("", _) => String::new(),
            (r, "") => r.to_owned(),
            (r, g) => format!("{r}.{g}"),
        };
        let message = match (qualified.as_str(), name) {
            ("", _) => format!("forbidden: {why}"),
            (q, "") => format!("{q} is forbidden: {why}"),
            (q, n) => format!("{q} {n:?} is forbidden: {why}"),
        };
        Self::new(403, "Forbidden", message).with_details(name, group, resource)
    }

    /// 503 while an outage fault is on.
    pub fn unavailable() -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    /// 503 with the server's own words: what a proxy or port-forward answers when it cannot
    /// reach the pod (no endpoint, no backend that runs processes, a refused connect).
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 500: the pod backend failed in a way the request did not cause.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object a real API server sends for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((name, group, kind)) = &self.details {
            // Empty fields are left out, as Go's `omitempty` leaves them.
            let fields = [("name", name), ("group", group), ("kind", kind)];
            let details: serde_json::Map<String, Value> = fields
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_owned(), json!(v)))
                .collect();
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// Result of an API operation.
pub type ApiResult<T> = Result<T, ApiError>;
