//! Decoding of `application/vnd.kubernetes.protobuf` request bodies into JSON.
//!
//! kubectl 1.32 sends built-in objects made by its generators (`kubectl create namespace`,
//! `create configmap`, `create secret`, `create serviceaccount`) as protobuf: the `k8s\0`
//! magic, then a `runtime.Unknown` envelope whose `raw` bytes are the object's message from
//! `k8s.io/api` `generated.proto`. This module decodes those messages (Namespace, ConfigMap,
//! Secret, ServiceAccount, Lease, with their ObjectMeta; and `kubectl auth can-i`'s
//! SelfSubjectAccessReview) by field number into the JSON the
//! rest of the server handles. Other types are refused with 415, and responses are always
//! JSON (clients accept it).

use base64::Engine as _;
use serde_json::{json, Map, Value};

/// How one protobuf field maps to JSON.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Int,
    Bool,
    Time,
    Msg(&'static [Field]),
    RepStr,
    RepMsg(&'static [Field]),
    MapStr,
    MapBytes,
}

type Field = (u64, &'static str, Kind);

const TIME: Kind = Kind::Time;

const OWNER_REF: &[Field] = &[
    (1, "kind", Kind::Str),
    (3, "name", Kind::Str),
    (4, "uid", Kind::Str),
    (5, "apiVersion", Kind::Str),
    (6, "controller", Kind::Bool),
    (7, "blockOwnerDeletion", Kind::Bool),
];

const OBJECT_META: &[Field] = &[
    (1, "name", Kind::Str),
    (2, "generateName", Kind::Str),
    (3, "namespace", Kind::Str),
    (5, "uid", Kind::Str),
    (6, "resourceVersion", Kind::Str),
    (7, "generation", Kind::Int),
    (8, "creationTimestamp", TIME),
    (9, "deletionTimestamp", TIME),
    (10, "deletionGracePeriodSeconds", Kind::Int),
    (11, "labels", Kind::MapStr),
    (12, "annotations", Kind::MapStr),
    (13, "ownerReferences", Kind::RepMsg(OWNER_REF)),
    (14, "finalizers", Kind::RepStr),
];

const CONFIG_MAP: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "data", Kind::MapStr),
    (3, "binaryData", Kind::MapBytes),
    (4, "immutable", Kind::Bool),
];

const SECRET: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "data", Kind::MapBytes),
    (3, "type", Kind::Str),
    (4, "stringData", Kind::MapStr),
    (5, "immutable", Kind::Bool),
];

const NAMESPACE: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "spec", Kind::Msg(&[(1, "finalizers", Kind::RepStr)])),
    (3, "status", Kind::Msg(&[(1, "phase", Kind::Str)])),
];

const OBJECT_REF: &[Field] = &[
    (1, "kind", Kind::Str),
    (2, "namespace", Kind::Str),
    (3, "name", Kind::Str),
    (4, "uid", Kind::Str),
    (5, "apiVersion", Kind::Str),
    (6, "resourceVersion", Kind::Str),
    (7, "fieldPath", Kind::Str),
];

const SERVICE_ACCOUNT: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "secrets", Kind::RepMsg(OBJECT_REF)),
    (
        3,
        "imagePullSecrets",
        Kind::RepMsg(&[(1, "name", Kind::Str)]),
    ),
    (4, "automountServiceAccountToken", Kind::Bool),
];

/// `authorization.k8s.io/v1` ResourceAttributes (its selector fields are left out).
const RESOURCE_ATTRIBUTES: &[Field] = &[
    (1, "namespace", Kind::Str),
    (2, "verb", Kind::Str),
    (3, "group", Kind::Str),
    (4, "version", Kind::Str),
    (5, "resource", Kind::Str),
    (6, "subresource", Kind::Str),
    (7, "name", Kind::Str),
];

const NON_RESOURCE_ATTRIBUTES: &[Field] = &[(1, "path", Kind::Str), (2, "verb", Kind::Str)];

const SSAR_SPEC: &[Field] = &[
    (1, "resourceAttributes", Kind::Msg(RESOURCE_ATTRIBUTES)),
    (
        2,
        "nonResourceAttributes",
        Kind::Msg(NON_RESOURCE_ATTRIBUTES),
    ),
];

/// `kubectl auth can-i`'s SelfSubjectAccessReview.
const SELF_SUBJECT_ACCESS_REVIEW: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (2, "spec", Kind::Msg(SSAR_SPEC)),
];

const LEASE: &[Field] = &[
    (1, "metadata", Kind::Msg(OBJECT_META)),
    (
        2,
        "spec",
        Kind::Msg(&[
            (1, "holderIdentity", Kind::Str),
            (2, "leaseDurationSeconds", Kind::Int),
            (3, "acquireTime", Kind::Time),
            (4, "renewTime", Kind::Time),
            (5, "leaseTransitions", Kind::Int),
            (6, "strategy", Kind::Str),
            (7, "preferredHolder", Kind::Str),
        ]),
    ),
];

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
        let end = self.pos.checked_add(len).ok_or("length overflow")?;
        let out = self.buf.get(self.pos..end).ok_or("truncated field")?;
        self.pos = end;
        Ok(out)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.advance(8),
            2 => self.bytes().map(|_| ()),
            5 => self.advance(4),
            _ => Err(format!("unsupported wire type {wire}")),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        if self.pos + n > self.buf.len() {
            return Err("truncated field".into());
        }
        self.pos += n;
        Ok(())
    }

    /// Iterates `(field number, wire type)` until the end.
    fn next_tag(&mut self) -> Result<Option<(u64, u64)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let tag = self.varint()?;
        Ok(Some((tag >> 3, tag & 7)))
    }
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8 in a string field".to_string())
}

fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), String> {
    let mut r = Reader { buf: b, pos: 0 };
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    while let Some((field, wire)) = r.next_tag()? {
        match (field, wire) {
            (1, 2) => key = utf8(r.bytes()?)?,
            (2, 2) if bytes_value => {
                value = json!(base64::engine::general_purpose::STANDARD.encode(r.bytes()?))
            }
            (2, 2) => value = json!(utf8(r.bytes()?)?),
            (_, w) => r.skip(w)?,
        }
    }
    Ok((key, value))
}

fn time(b: &[u8]) -> Result<Value, String> {
    let mut r = Reader { buf: b, pos: 0 };
    let mut seconds = 0i64;
    while let Some((field, wire)) = r.next_tag()? {
        match (field, wire) {
            (1, 0) => seconds = r.varint()? as i64,
            (_, w) => r.skip(w)?,
        }
    }
    let ts = jiff::Timestamp::from_second(seconds).map_err(|e| e.to_string())?;
    Ok(json!(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
}

fn decode_message(b: &[u8], schema: &[Field]) -> Result<Value, String> {
    let mut r = Reader { buf: b, pos: 0 };
    let mut out = Map::new();
    while let Some((field, wire)) = r.next_tag()? {
        let Some((_, name, kind)) = schema.iter().find(|(n, _, _)| *n == field) else {
            r.skip(wire)?;
            continue;
        };
        let name = name.to_string();
        match (kind, wire) {
            // Empty strings, zeros and false are what Go omits from JSON (omitempty).
            (Kind::Str, 2) => {
                let s = utf8(r.bytes()?)?;
                if !s.is_empty() {
                    out.insert(name, json!(s));
                }
            }
            (Kind::Int, 0) => {
                let v = r.varint()? as i64;
                if v != 0 {
                    out.insert(name, json!(v));
                }
            }
            (Kind::Bool, 0) => {
                if r.varint()? != 0 {
                    out.insert(name, json!(true));
                }
            }
            (Kind::Time, 2) => {
                out.insert(name, time(r.bytes()?)?);
            }
            (Kind::Msg(s), 2) => {
                out.insert(name, decode_message(r.bytes()?, s)?);
            }
            (Kind::RepStr, 2) => {
                let s = utf8(r.bytes()?)?;
                push(&mut out, name, json!(s));
            }
            (Kind::RepMsg(s), 2) => {
                let v = decode_message(r.bytes()?, s)?;
                push(&mut out, name, v);
            }
            (Kind::MapStr | Kind::MapBytes, 2) => {
                let (k, v) = map_entry(r.bytes()?, matches!(kind, Kind::MapBytes))?;
                if let Some(m) = out.entry(name).or_insert_with(|| json!({})).as_object_mut() {
                    m.insert(k, v);
                }
            }
            (_, w) => r.skip(w)?,
        }
    }
    Ok(Value::Object(out))
}

fn push(out: &mut Map<String, Value>, name: String, v: Value) {
    if let Some(a) = out.entry(name).or_insert_with(|| json!([])).as_array_mut() {
        a.push(v);
    }
}

/// Decodes a protobuf request body into the JSON object it encodes.
///
/// # Errors
/// A message (sent as 400, or 415 by the caller for unsupported kinds) when the envelope is
/// malformed or the kind is not one this server decodes.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let raw = body
        .strip_prefix(b"k8s\0")
        .ok_or("not a Kubernetes protobuf message (missing k8s magic)")?;
    let mut r = Reader { buf: raw, pos: 0 };
    let (mut api_version, mut kind, mut inner) = (String::new(), String::new(), &[][..]);
    while let Some((field, wire)) = r.next_tag()? {
        match (field, wire) {
            (1, 2) => {
                let tm = decode_message(
                    r.bytes()?,
                    &[(1, "apiVersion", Kind::Str), (2, "kind", Kind::Str)],
                )?;
                api_version = tm["apiVersion"].as_str().unwrap_or("").to_string();
                kind = tm["kind"].as_str().unwrap_or("").to_string();
            }
            (2, 2) => inner = r.bytes()?,
            (_, w) => r.skip(w)?,
        }
    }
    let schema = match (api_version.as_str(), kind.as_str()) {
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("coordination.k8s.io/v1", "Lease") => LEASE,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => SELF_SUBJECT_ACCESS_REVIEW,
        _ => {
            return Err(format!(
                "protobuf bodies of {api_version} {kind} are not supported; send JSON"
            ))
        }
    };
    let mut obj = decode_message(inner, schema)?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn a_kubectl_created_configmap_decodes() {
        let meta = field(1, b"foo");
        let entry = [field(1, b"a"), field(2, b"b")].concat();
        let cm = [field(1, &meta), field(2, &entry)].concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let unknown = [field(1, &type_meta), field(2, &cm)].concat();
        let body = [b"k8s\0".as_slice(), &unknown].concat();
        let obj = decode(&body).expect("decodes");
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "foo"}, "data": {"a": "b"}})
        );
    }

    #[test]
    fn truncated_bodies_are_refused() {
        assert!(decode(b"k8s\0\x0a\x10ab").is_err());
        assert!(decode(b"{}").is_err());
    }
}
