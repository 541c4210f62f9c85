//! The functions a CRD rule may call, with the signatures kube-apiserver v1.34 declares for them
//! (CEL's standard library, the strings extension, Kubernetes' lists, regex, URL, quantity, IP,
//! CIDR, semver and optional libraries), and what each call adds to the cost estimate as
//! cel-go's estimator (`checker/cost.go`) and Kubernetes' (`apiserver/pkg/cel/library/cost.go`)
//! add it. Functions whose exact signatures we do not model are declared with any arguments and a
//! `dyn` result, so a rule using them is never refused for a type error it does not have.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::cel_types::Ty;

/// One declared overload.
#[derive(Debug)]
pub(super) struct Overload {
    /// Called as `target.name(args)` (the first parameter is the target).
    pub(super) member: bool,
    pub(super) params: Vec<Ty>,
    pub(super) result: Ty,
}

/// A declared function: its overloads, or (`lenient`) any arguments with the result `lenient`
/// holds.
#[derive(Debug, Default)]
pub(super) struct Function {
    pub(super) overloads: Vec<Overload>,
    pub(super) lenient: Option<Ty>,
}

/// Signatures, one a line: `name(params) -> result` or `target.name(params) -> result`, types as
/// CEL spells them (`A`, `B` are type parameters).
const SIGNATURES: &str = "
!_(bool) -> bool
-_(int) -> int
-_(double) -> double
@not_strictly_false(bool) -> bool
_==_(A, A) -> bool
_!=_(A, A) -> bool
_+_(int, int) -> int
_+_(uint, uint) -> uint
_+_(double, double) -> double
_+_(string, string) -> string
_+_(bytes, bytes) -> bytes
_+_(list(A), list(A)) -> list(A)
_+_(timestamp, duration) -> timestamp
_+_(duration, timestamp) -> timestamp
_+_(duration, duration) -> duration
_-_(int, int) -> int
_-_(uint, uint) -> uint
_-_(double, double) -> double
_-_(timestamp, timestamp) -> duration
_-_(timestamp, duration) -> timestamp
_-_(duration, duration) -> duration
_*_(int, int) -> int
_*_(uint, uint) -> uint
_*_(double, double) -> double
_/_(int, int) -> int
_/_(uint, uint) -> uint
_/_(double, double) -> double
_%_(int, int) -> int
_%_(uint, uint) -> uint
_[_](list(A), int) -> A
_[_](map(A, B), A) -> B
@in(A, list(A)) -> bool
@in(A, map(A, B)) -> bool
size(string) -> int
size(bytes) -> int
size(list(A)) -> int
size(map(A, B)) -> int
string.size() -> int
bytes.size() -> int
list(A).size() -> int
map(A, B).size() -> int
int(int) -> int
int(uint) -> int
int(double) -> int
int(string) -> int
int(timestamp) -> int
uint(int) -> uint
uint(uint) -> uint
uint(double) -> uint
uint(string) -> uint
double(int) -> double
double(uint) -> double
double(double) -> double
double(string) -> double
string(int) -> string
string(uint) -> string
string(double) -> string
string(string) -> string
string(bool) -> string
string(bytes) -> string
string(timestamp) -> string
string(duration) -> string
bytes(bytes) -> bytes
bytes(string) -> bytes
bool(bool) -> bool
bool(string) -> bool
timestamp(string) -> timestamp
timestamp(timestamp) -> timestamp
timestamp(int) -> timestamp
duration(string) -> duration
duration(duration) -> duration
dyn(A) -> dyn
type(A) -> type(A)
matches(string, string) -> bool
string.matches(string) -> bool
string.contains(string) -> bool
string.startsWith(string) -> bool
string.endsWith(string) -> bool
string.charAt(int) -> string
string.indexOf(string) -> int
string.indexOf(string, int) -> int
string.lastIndexOf(string) -> int
string.lastIndexOf(string, int) -> int
string.lowerAscii() -> string
string.upperAscii() -> string
string.replace(string, string) -> string
string.replace(string, string, int) -> string
string.split(string) -> list(string)
string.split(string, int) -> list(string)
string.substring(int) -> string
string.substring(int, int) -> string
string.trim() -> string
string.reverse() -> string
string.format(list(dyn)) -> string
strings.quote(string) -> string
list(string).join() -> string
list(string).join(string) -> string
list(A).indexOf(A) -> int
list(A).lastIndexOf(A) -> int
string.find(string) -> string
string.findAll(string) -> list(string)
string.findAll(string, int) -> list(string)
optional.of(A) -> optional(A)
optional.ofNonZeroValue(A) -> optional(A)
optional.none() -> optional(dyn)
optional(A).hasValue() -> bool
optional(A).value() -> A
optional(A).orValue(A) -> A
optional(A).or(optional(A)) -> optional(A)
sets.contains(list(A), list(A)) -> bool
sets.equivalent(list(A), list(A)) -> bool
sets.intersects(list(A), list(A)) -> bool
url(string) -> URL
isURL(string) -> bool
URL.getScheme() -> string
URL.getHost() -> string
URL.getHostname() -> string
URL.getPort() -> string
URL.getEscapedPath() -> string
URL.getQuery() -> map(string, list(string))
isQuantity(string) -> bool
quantity(string) -> Quantity
isIP(string) -> bool
ip(string) -> IP
ip.isCanonical(string) -> bool
isCIDR(string) -> bool
cidr(string) -> CIDR
isSemver(string) -> bool
isSemver(string, bool) -> bool
semver(string) -> Semver
semver(string, bool) -> Semver
";

/// Comparisons: every type compares with itself; numbers also across types.
const ORDERED: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "timestamp",
    "duration",
];

/// Element types of lists `sum()` adds up (Kubernetes' lists library).
const SUMMABLE: &[&str] = &["int", "uint", "double", "duration"];

/// Timestamp and duration getters (`ts.getHours()`, `ts.getHours('UTC')`).
const TIME_GETTERS: &[&str] = &[
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
];

/// Functions declared without modelled signatures (any arguments, `dyn` result): members of the
/// Kubernetes quantity, IP, CIDR, semver and format libraries, and CEL extensions kube-apiserver
/// may enable.
const LENIENT: &[&str] = &[
    "sign",
    "asInteger",
    "asApproximateFloat",
    "add",
    "sub",
    "compareTo",
    "family",
    "ip",
    "masked",
    "prefixLength",
    "major",
    "minor",
    "patch",
    "validate",
    "format.named",
    "format.dns1123Label",
    "format.dns1123Subdomain",
    "format.dns1035Label",
    "format.qualifiedName",
    "format.dns1123LabelPrefix",
    "format.dns1123SubdomainPrefix",
    "format.dns1035LabelPrefix",
    "format.labelValue",
    "format.uri",
    "format.uuid",
    "format.byte",
    "format.date",
    "format.datetime",
    "slice",
    "flatten",
    "distinct",
    "sort",
    "sortBy",
    "first",
    "last",
    "lists.range",
    "math.greatest",
    "math.least",
    "math.ceil",
    "math.floor",
    "math.round",
    "math.trunc",
    "math.abs",
    "math.sign",
    "math.bitAnd",
    "math.bitOr",
    "math.bitXor",
    "math.bitNot",
    "math.bitShiftLeft",
    "math.bitShiftRight",
    "math.sqrt",
];

/// Members and functions of those libraries that give a `bool` (any arguments).
const LENIENT_BOOL: &[&str] = &[
    "isInteger",
    "isGreaterThan",
    "isLessThan",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "containsIP",
    "containsCIDR",
    "math.isNaN",
    "math.isInf",
    "math.isFinite",
];

/// Parses a type as CEL spells it.
pub(super) fn parse_type(s: &str) -> Option<Ty> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix("list(").and_then(|r| r.strip_suffix(')')) {
        return Some(Ty::List(Box::new(parse_type(inner)?)));
    }
    if let Some(inner) = s
        .strip_prefix("optional(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return Some(Ty::Optional(Box::new(parse_type(inner)?)));
    }
    if let Some(inner) = s.strip_prefix("type(").and_then(|r| r.strip_suffix(')')) {
        return Some(Ty::Type(Box::new(parse_type(inner)?)));
    }
    if let Some(inner) = s.strip_prefix("map(").and_then(|r| r.strip_suffix(')')) {
        let (k, v) = split_top(inner)?;
        return Some(Ty::Map(Box::new(parse_type(k)?), Box::new(parse_type(v)?)));
    }
    Some(match s {
        "dyn" => Ty::Dyn,
        "bool" => Ty::Bool,
        "int" => Ty::Int,
        "uint" => Ty::Uint,
        "double" => Ty::Double,
        "string" => Ty::String,
        "bytes" => Ty::Bytes,
        "timestamp" => Ty::Timestamp,
        "duration" => Ty::Duration,
        "A" => Ty::Param("A"),
        "B" => Ty::Param("B"),
        "URL" => Ty::Opaque("kubernetes.URL"),
        "Quantity" => Ty::Opaque("kubernetes.Quantity"),
        "IP" => Ty::Opaque("net.IP"),
        "CIDR" => Ty::Opaque("net.CIDR"),
        "Semver" => Ty::Opaque("kubernetes.Semver"),
        _ => return None,
    })
}

/// Splits `a, b` at its top-level comma.
fn split_top(s: &str) -> Option<(&str, &str)> {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => return Some((&s[..i], &s[i + 1..])),
            _ => {}
        }
    }
    None
}

/// Parses one line of [`SIGNATURES`]: the function's name and its overload.
fn parse_signature(line: &str) -> Option<(String, Overload)> {
    let (call, result) = line.split_once(" -> ")?;
    let result = parse_type(result)?;
    let call = call.trim();
    let inner_end = call.len().checked_sub(1)?;
    if !call.ends_with(')') {
        return None;
    }
    // The parameters' opening parenthesis: the one matching the last.
    let mut depth = 0;
    let mut open = None;
    for (i, c) in call.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    open = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let open = open?;
    let head = &call[..open];
    let inner = &call[open + 1..inner_end];
    let mut params = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let (p, after) = split_top(rest).unwrap_or((rest, ""));
        params.push(parse_type(p)?);
        rest = after.trim();
    }
    // `target.name`: the target is a type when it parses as one (`list(A).size`), else the name is
    // qualified (`strings.quote`).
    if let Some(dot) = head.rfind('.') {
        let (target, name) = (&head[..dot], &head[dot + 1..]);
        if let Some(t) = parse_type(target) {
            params.insert(0, t);
            return Some((
                name.to_string(),
                Overload {
                    member: true,
                    params,
                    result,
                },
            ));
        }
    }
    Some((
        head.to_string(),
        Overload {
            member: false,
            params,
            result,
        },
    ))
}

fn build() -> HashMap<String, Function> {
    let mut table: HashMap<String, Function> = HashMap::new();
    let mut add = |name: String, o: Overload| table.entry(name).or_default().overloads.push(o);
    for line in SIGNATURES.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some((name, o)) = parse_signature(line) {
            add(name, o);
        }
    }
    for op in ["_<_", "_<=_", "_>_", "_>=_"] {
        for t in ORDERED {
            if let Some(ty) = parse_type(t) {
                add(
                    op.to_string(),
                    Overload {
                        member: false,
                        params: vec![ty.clone(), ty],
                        result: Ty::Bool,
                    },
                );
            }
        }
        for (a, b) in [
            (Ty::Int, Ty::Uint),
            (Ty::Int, Ty::Double),
            (Ty::Uint, Ty::Int),
            (Ty::Uint, Ty::Double),
            (Ty::Double, Ty::Int),
            (Ty::Double, Ty::Uint),
        ] {
            add(
                op.to_string(),
                Overload {
                    member: false,
                    params: vec![a, b],
                    result: Ty::Bool,
                },
            );
        }
    }
    for t in ORDERED {
        if let Some(ty) = parse_type(t) {
            for (name, result) in [
                ("isSorted", Ty::Bool),
                ("min", ty.clone()),
                ("max", ty.clone()),
            ] {
                add(
                    name.to_string(),
                    Overload {
                        member: true,
                        params: vec![Ty::List(Box::new(ty.clone()))],
                        result,
                    },
                );
            }
        }
    }
    for t in SUMMABLE {
        if let Some(ty) = parse_type(t) {
            add(
                "sum".to_string(),
                Overload {
                    member: true,
                    params: vec![Ty::List(Box::new(ty.clone()))],
                    result: ty,
                },
            );
        }
    }
    for getter in TIME_GETTERS {
        for params in [
            vec![Ty::Timestamp],
            vec![Ty::Timestamp, Ty::String],
            vec![Ty::Duration],
        ] {
            add(
                (*getter).to_string(),
                Overload {
                    member: true,
                    params,
                    result: Ty::Int,
                },
            );
        }
    }
    for name in LENIENT {
        table.entry((*name).to_string()).or_default().lenient = Some(Ty::Dyn);
    }
    for name in LENIENT_BOOL {
        table.entry((*name).to_string()).or_default().lenient = Some(Ty::Bool);
    }
    table
}

static FUNCTIONS: LazyLock<HashMap<String, Function>> = LazyLock::new(build);

/// The declared function `name` (qualified names such as `optional.of` included).
pub(super) fn function(name: &str) -> Option<&'static Function> {
    FUNCTIONS.get(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signature_parses() {
        for line in SIGNATURES.lines().map(str::trim).filter(|l| !l.is_empty()) {
            assert!(parse_signature(line).is_some(), "{line}");
        }
    }

    #[test]
    fn member_and_qualified_names_are_told_apart() {
        let size = function("size").expect("size");
        assert!(size.overloads.iter().any(|o| o.member));
        assert!(size.overloads.iter().any(|o| !o.member));
        let quote = function("strings.quote").expect("quote");
        assert!(quote.overloads.iter().all(|o| !o.member));
        assert!(function("foo").is_none());
    }
}
