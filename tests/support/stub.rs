//! A stub HTTP endpoint on loopback for the deciders and hooks the controller calls (a webhook
//! agent, a reconcile hook): it answers a script in order (the last answer repeats) and keeps
//! every JSON request it got. It can also start down (its port refuses connections) and come up
//! later on the same address.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::Value;

/// A function of the request giving `(status, body)`.
pub type AnswerFn = Arc<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

/// What the stub answers one request with.
#[derive(Clone)]
pub enum Answer {
    /// 200 with this JSON.
    Json(Value),
    /// This status and (text) body.
    Raw(u16, &'static str),
    /// Never answer.
    Hang,
    /// This status and JSON body, computed from the request.
    By(AnswerFn),
}

#[derive(Clone)]
struct StubState {
    answers: Arc<Mutex<Vec<Answer>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

/// A stub endpoint; `url` is the one to put in a manifest.
pub struct Stub {
    /// `http://<addr><path>`.
    pub url: String,
    addr: SocketAddr,
    path: String,
    state: StubState,
}

impl Stub {
    /// Serves `POST path` answering `answers` in order (the last repeats; none: 500).
    pub async fn start(path: &str, answers: Vec<Answer>) -> Stub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Stub::serve_on(listener, path, answers)
    }

    /// Serves `POST /` answering 200 with `answer(request)`.
    pub async fn json(answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Stub {
        Stub::with_status(move |request| (200, answer(request))).await
    }

    /// Serves `POST /` answering `answer(request)` as `(status, body)`.
    pub async fn with_status(
        answer: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static,
    ) -> Stub {
        Stub::start("/", vec![Answer::By(Arc::new(answer))]).await
    }

    /// A stub whose port refuses connections until [`Stub::come_up`].
    pub fn down(path: &str) -> Stub {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        Stub {
            url: format!("http://{addr}{path}"),
            addr,
            path: path.to_string(),
            state: StubState {
                answers: Arc::default(),
                requests: Arc::default(),
            },
        }
    }

    /// Starts serving on the address of a [`Stub::down`].
    pub async fn come_up(&mut self, answers: Vec<Answer>) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        *self = Stub::serve_on(listener, &self.path, answers);
    }

    fn serve_on(listener: tokio::net::TcpListener, path: &str, answers: Vec<Answer>) -> Stub {
        let addr = listener.local_addr().unwrap();
        let state = StubState {
            answers: Arc::new(Mutex::new(answers)),
            requests: Arc::default(),
        };
        let app = Router::new()
            .route(path, post(answer))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Stub {
            url: format!("http://{addr}{path}"),
            addr,
            path: path.to_string(),
            state,
        }
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().unwrap().clone()
    }
}

async fn answer(State(state): State<StubState>, Json(request): Json<Value>) -> Response {
    let next = {
        let mut answers = state.answers.lock().unwrap();
        if answers.len() > 1 {
            answers.remove(0)
        } else {
            answers
                .first()
                .cloned()
                .unwrap_or(Answer::Raw(500, "no answer"))
        }
    };
    let response = match next {
        Answer::Json(value) => Some(Json(value).into_response()),
        Answer::Raw(status, body) => {
            Some((StatusCode::from_u16(status).unwrap(), body).into_response())
        }
        Answer::By(answer) => {
            let (status, body) = answer(&request);
            Some((StatusCode::from_u16(status).unwrap(), Json(body)).into_response())
        }
        Answer::Hang => None,
    };
    state.requests.lock().unwrap().push(request);
    match response {
        Some(response) => response,
        None => std::future::pending().await,
    }
}
