//! The `run_command` function tool (`[llm] tools = true`): offered in every request with
//! `tool_choice: "auto"`; a reply may call it once, with `{"command": "..."}`, instead of
//! giving a fenced block. The command's observation goes back as a `tool` message answering
//! the call. Anything else in `tool_calls` (several calls, another function, arguments that are
//! not that JSON object, a call without an id) is a malformed reply.

use super::transcript::{FunctionCall, ToolCall};
use serde_json::{json, Value};

/// The one function the model may call.
pub const RUN_COMMAND: &str = "run_command";

/// The `tools` of a request.
pub fn definitions() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": RUN_COMMAND,
            "description": "Run one shell command with `sh -c`, as root, in the working \
                directory, without a terminal; the result (exit status, output, working \
                directory and its listing) comes back.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The shell command."}
                },
                "required": ["command"],
                "additionalProperties": false
            }
        }
    }])
}

/// The command of a reply's `tool_calls`, with the call as kept in the conversation, or why
/// the calls are not one valid `run_command` call.
pub fn parse(calls: &[Value]) -> Result<(String, ToolCall), String> {
    let [call] = calls else {
        return Err(format!(
            "{} tool calls in one reply; call {RUN_COMMAND} exactly once",
            calls.len()
        ));
    };
    if let Some(kind) = call.get("type") {
        if kind != "function" {
            return Err(format!(
                "a tool call of type {}, not a function",
                crate::text::cut(&kind.to_string())
            ));
        }
    }
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .ok_or("a tool call without an id")?;
    let function = call
        .get("function")
        .ok_or("a tool call without a function")?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or("a tool call without a function name")?;
    if name != RUN_COMMAND {
        return Err(format!(
            "a call of the unknown function `{}` (the one tool is {RUN_COMMAND})",
            crate::text::cut(name)
        ));
    }
    // Servers send the arguments as a JSON text; a few as the object itself.
    let args: Value = match function.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
            format!(
                "the arguments of {RUN_COMMAND} are not JSON ({e}): {}",
                crate::text::cut(s)
            )
        })?,
        Some(v @ Value::Object(_)) => v.clone(),
        _ => return Err(format!("a call of {RUN_COMMAND} without arguments")),
    };
    let command = args
        .get("command")
        .and_then(Value::as_str)
        .map(str::trim)
        .ok_or_else(|| {
            format!(
                "the arguments of {RUN_COMMAND} have no string `command`: {}",
                crate::text::cut(&args.to_string())
            )
        })?;
    if command.is_empty() {
        return Err(format!("the command of {RUN_COMMAND} is empty"));
    }
    let kept = ToolCall {
        id: id.to_string(),
        kind: "function".into(),
        function: FunctionCall {
            name: RUN_COMMAND.into(),
            arguments: json!({ "command": command }).to_string(),
        },
    };
    Ok((command.to_string(), kept))
}

/// A text showing the calls of a malformed reply (kept in the conversation as text: a
/// malformed call sent back as a call could make the server refuse the request).
pub fn describe(calls: &[Value]) -> String {
    let shown: Vec<String> = calls
        .iter()
        .map(|c| crate::text::cut(&c.to_string()).into_owned())
        .collect();
    format!("[tool calls: {}]", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: Value) -> Value {
        json!({"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}})
    }

    #[test]
    fn one_run_command_call_is_a_command() {
        let (cmd, kept) =
            parse(&[call("run_command", json!("{\"command\": \" ls -la \"}"))]).unwrap();
        assert_eq!(cmd, "ls -la");
        assert_eq!(kept.id, "call_1");
        assert_eq!(kept.function.arguments, r#"{"command":"ls -la"}"#);
        let (cmd, _) = parse(&[call("run_command", json!({"command": "pwd"}))]).unwrap();
        assert_eq!(cmd, "pwd");
    }

    #[test]
    fn anything_else_is_malformed_and_says_why() {
        let ok = call("run_command", json!("{\"command\":\"ls\"}"));
        let cases = [
            (vec![], "0 tool calls"),
            (vec![ok.clone(), ok.clone()], "2 tool calls"),
            (vec![call("rm_rf", json!("{}"))], "unknown function `rm_rf`"),
            (
                vec![call("run_command", json!("{\"command\":"))],
                "not JSON",
            ),
            (
                vec![call("run_command", json!("{\"cmd\":\"ls\"}"))],
                "no string `command`",
            ),
            (
                vec![call("run_command", json!("{\"command\":\" \"}"))],
                "is empty",
            ),
            (vec![call("run_command", json!(7))], "without arguments"),
            (
                vec![
                    json!({"type": "function", "function": {"name": "run_command", "arguments": "{}"}}),
                ],
                "without an id",
            ),
        ];
        for (calls, why) in cases {
            let e = parse(&calls).unwrap_err();
            assert!(e.contains(why), "{e:?} should say {why:?}");
        }
    }
}
