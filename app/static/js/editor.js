// The spec editor: a plain textarea over a backdrop that mirrors its text, so that lines with a
// problem can be highlighted and the message written right after the line (lines never wrap, so
// the backdrop's lines stay aligned with the textarea's). A gutter numbers the lines.

const escapeHTML = (text) => text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

export class SpecEditor {
  constructor({ textarea, backdrop, gutter, list }) {
    Object.assign(this, { textarea, backdrop, gutter, list });
    this.problems = []; // {line (0-based or -1), field, message}
    textarea.addEventListener("input", () => this.render());
    textarea.addEventListener("scroll", () => this.syncScroll());
    new ResizeObserver(() => this.syncScroll()).observe(textarea);
    list.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-line]");
      if (button) this.goTo(Number(button.dataset.line));
    });
    this.render();
  }

  get text() {
    return this.textarea.value;
  }

  set text(value) {
    this.textarea.value = value;
    this.setProblems([]);
  }

  setProblems(problems) {
    this.problems = problems;
    this.textarea.setAttribute("aria-invalid", problems.length ? "true" : "false");
    this.list.replaceChildren(...problems.map((problem) => this.item(problem)));
    this.render();
  }

  item(problem) {
    const li = document.createElement("li");
    const where = problem.line >= 0 ? `Line ${problem.line + 1}` : "Spec";
    const text = `${where}${problem.field ? ` · ${problem.field}` : ""}: ${problem.message}`;
    if (problem.line >= 0) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.line = String(problem.line);
      button.textContent = text;
      li.append(button);
    } else {
      li.className = "field-error";
      li.textContent = text;
    }
    return li;
  }

  render() {
    const lines = this.text.split("\n");
    const byLine = new Map();
    for (const problem of this.problems) {
      if (problem.line >= 0) byLine.set(problem.line, [...(byLine.get(problem.line) ?? []), problem.message]);
    }
    this.backdrop.innerHTML = lines
      .map((line, index) => {
        const messages = byLine.get(index);
        if (!messages) return escapeHTML(line);
        const note = `<span class="inline-error">← ${escapeHTML(messages.join("; "))}</span>`;
        return `<mark>${escapeHTML(line) || " "}</mark>${note}`;
      })
      .join("\n") + "\n";
    this.gutter.innerHTML = lines.map((_, index) => (byLine.has(index) ? `<span class="bad">${index + 1}</span>` : `${index + 1}`)).join("\n") + "\n";
    this.syncScroll();
  }

  syncScroll() {
    this.backdrop.scrollTop = this.textarea.scrollTop;
    this.backdrop.scrollLeft = this.textarea.scrollLeft;
    this.gutter.scrollTop = this.textarea.scrollTop;
    this.gutter.style.height = `${this.textarea.offsetHeight}px`;
  }

  // Put the caret at the start of `line` and bring it into view.
  goTo(line) {
    const lines = this.text.split("\n");
    const start = lines.slice(0, line).reduce((total, text) => total + text.length + 1, 0);
    this.textarea.focus();
    this.textarea.setSelectionRange(start, start + (lines[line]?.length ?? 0));
    const lineHeight = parseFloat(getComputedStyle(this.textarea).lineHeight) || 20;
    this.textarea.scrollTop = Math.max(0, line * lineHeight - this.textarea.clientHeight / 2);
  }
}
