// Live pages: when the API says a saga in view changed, fetch this page's live region again and
// swap it in, unless the reader is typing in it (then say the page changed instead).
(function () {
  const source = document.body.dataset.events;
  const live = document.getElementById("live");
  if (!source || !live || !window.EventSource) return;
  let queued = false;
  async function refresh() {
    queued = false;
    const busy = live.contains(document.activeElement) && document.activeElement.tagName === "INPUT";
    const typed = Array.from(live.querySelectorAll("input[name=reason]")).some((i) => i.value);
    if (busy || typed) { document.getElementById("stale").hidden = false; return; }
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    const answer = await fetch(url, { credentials: "same-origin" });
    if (answer.ok) live.innerHTML = await answer.text();
  }
  const events = new EventSource(source);
  events.addEventListener("ready", function () { document.body.dataset.live = "ready"; });
  events.addEventListener("change", function () {
    if (!queued) { queued = true; setTimeout(refresh, 100); }
  });
})();
