// Server-rendered parts of a page (templates/partials): fetch the HTML again and swap it in,
// keeping the keyboard focus on the element with the same id.
import { goLogin } from "./api.js";

export async function fetchPart(url) {
  const response = await fetch(url, { headers: { Accept: "text/html" } });
  if (response.redirected && new URL(response.url).pathname === "/login") {
    goLogin();
    return null;
  }
  return response.ok ? response.text() : null;
}

export function swapHTML(element, html) {
  const focused = document.activeElement && element.contains(document.activeElement) ? document.activeElement.id : null;
  element.innerHTML = html;
  if (focused) document.getElementById(focused)?.focus();
}

export async function refreshPart(element, url) {
  const html = await fetchPart(url);
  if (html === null) return false;
  swapHTML(element, html);
  return true;
}

// Call `fn` at most once per `ms`; a call inside the interval is run at its end (never dropped).
export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return () => {
    const wait = last + ms - Date.now();
    if (wait <= 0 && timer === null) {
      last = Date.now();
      fn();
    } else if (timer === null) {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, Math.max(0, wait));
    }
  };
}
