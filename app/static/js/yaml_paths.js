// Which line of a YAML spec holds a field: the API names bad fields by path (`schedule.nproc`,
// `schedule.stages.0.stop`), the editor shows the message on that line. Block mappings and
// sequences are followed by indentation; a path into a flow value (`{a: 1}`) stops at its key.

const KEY = /^([A-Za-z0-9_.-]+|"[^"]*"|'[^']*')\s*:(\s|$)/;

function keyOf(text) {
  const match = KEY.exec(text);
  return match ? match[1].replace(/^["']|["']$/g, "") : null;
}

// Map each field path ("a.b.0.c") to the 0-based line where it is written.
export function fieldLines(text) {
  const lines = new Map();
  const stack = []; // {indent, name, isItem, items}
  text.split("\n").forEach((line, number) => {
    const content = line.trimStart();
    if (!content || content.startsWith("#") || content.startsWith("---")) return;
    let indent = line.length - content.length;
    let rest = content;
    if (rest === "-" || rest.startsWith("- ")) {
      while (stack.length && (stack[stack.length - 1].indent > indent || (stack[stack.length - 1].indent === indent && stack[stack.length - 1].isItem))) stack.pop();
      const parent = stack[stack.length - 1];
      const index = parent ? (parent.items = (parent.items ?? -1) + 1) : 0;
      stack.push({ indent, name: String(index), isItem: true });
      lines.set(stack.map((entry) => entry.name).join("."), number);
      const after = rest.slice(1).trimStart();
      indent += rest.length - after.length;
      rest = after;
      if (!rest) return;
    } else {
      while (stack.length && stack[stack.length - 1].indent >= indent) stack.pop();
    }
    const key = keyOf(rest);
    if (key === null) return;
    stack.push({ indent, name: key, isItem: false });
    const path = stack.map((entry) => entry.name).join(".");
    if (!lines.has(path)) lines.set(path, number);
  });
  return lines;
}

// The line of `path` (a list of keys and indices), or of its longest written prefix; -1 if none.
export function lineOf(text, path) {
  const lines = fieldLines(text);
  for (let length = path.length; length > 0; length -= 1) {
    const key = path.slice(0, length).map(String).join(".");
    if (lines.has(key)) return lines.get(key);
  }
  return -1;
}
