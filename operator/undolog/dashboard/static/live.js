// Live pages: when the API says a saga in view changed, fetch this page's live region again and
// swap it in, unless the reader is typing in it (then say the page changed instead).
// One fetch at a time, and after one that took long a pause as long: each change used to fetch
// 100 ms later whatever was in flight, and with a listing slower than that (thousands of sagas)
// and sagas changing all the time, an open page kept several LISTs of everything going.
(function () {
  const source = document.body.dataset.events;
  const live = document.getElementById("live");
  if (!source || !live || !window.EventSource) return;
  let timer = null, running = false, changed = false, took = 0;
  function schedule() {
    if (running) { changed = true; return; }
    if (!timer) timer = setTimeout(refresh, Math.max(100, took));
  }
  async function refresh() {
    timer = null;
    const busy = live.contains(document.activeElement) && document.activeElement.tagName === "INPUT";
    const typed = Array.from(live.querySelectorAll("input[name=reason]")).some((i) => i.value);
    if (busy || typed) { document.getElementById("stale").hidden = false; return; }
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    running = true;
    const began = performance.now();
    try {
      const answer = await fetch(url, { credentials: "same-origin" });
      if (answer.ok) live.innerHTML = await answer.text();
    } finally {
      took = performance.now() - began;
      running = false;
      if (changed) { changed = false; schedule(); }
    }
  }
  const events = new EventSource(source);
  const paused = document.getElementById("paused");
  // Ready: the watch is up. What changed between this page's render and then was never
  // streamed (a page loaded by a retry's redirect kept showing the saga Halted), so fetch once.
  // The same after a reconnection (an apiserver restart ends the stream): the page said nothing
  // while it was not live.
  events.addEventListener("ready", function () {
    document.body.dataset.live = "ready";
    paused.hidden = true;
    schedule();
  });
  events.addEventListener("error", function () {
    // Closed for good (the sign-in expired: the stream was refused): only a reload helps.
    const closed = events.readyState === EventSource.CLOSED;
    document.body.dataset.live = closed ? "closed" : "reconnecting";
    if (closed) paused.textContent = "This page is not live: reload it to see the latest.";
    paused.hidden = false;
  });
  events.addEventListener("change", schedule);
})();
