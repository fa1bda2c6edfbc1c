() => {
  // TreeGraft app, client side: the tree's animation frames (kept in layout.meta.tg.frames, since the
  // Plot component drops a figure's own frames), keyboard (space plays/pauses, arrows step, p toggles
  // presentation mode, Esc leaves it), clicking a node highlights its path, clicking a timeline bar
  // opens that round (through the hidden #plot-click textbox), and the page's CSS.
  if (!document.getElementById("tg-style")) {
    const st = document.createElement("style");
    st.id = "tg-style";
    st.textContent = __CSS__;
    document.head.appendChild(st);
  }
  if (window.__tg) return;
  const tg = (window.__tg = { active: null });
  const FRAME_MS = __FRAME_MS__;
  const meta = (gd) => (gd.layout && gd.layout.meta && gd.layout.meta.tg) || null;
  const names = (gd) => ((meta(gd) || {}).frames || []).map((f) => f.name);
  const still = { frame: { duration: 0, redraw: true }, transition: { duration: 0 }, mode: "immediate" };

  function syncFrames(gd) {
    const m = meta(gd);
    if (!m || m.kind !== "tree" || gd._tgKey === m.key || !gd._transitionData) return;
    gd._tgKey = m.key;
    gd._tgPlaying = false;
    gd._tgFrame = m.frames.length ? m.frames[m.frames.length - 1].name : null;
    window.Plotly.deleteFrames(gd);
    if (m.frames.length) window.Plotly.addFrames(gd, m.frames);
  }
  function play(gd) {
    const ns = names(gd);
    if (!ns.length) return;
    const i = ns.indexOf(gd._tgFrame);
    const from = i < 0 || i >= ns.length - 1 ? 0 : i + 1;
    gd._tgPlaying = true;
    window.Plotly.animate(gd, ns.slice(from), { ...still, frame: { duration: FRAME_MS, redraw: true } });
  }
  function pause(gd) {
    gd._tgPlaying = false;
    window.Plotly.animate(gd, [null], { ...still, frame: { duration: 0, redraw: false } });
  }
  function stepBy(gd, d) {
    const ns = names(gd);
    if (!ns.length) return;
    let i = ns.indexOf(gd._tgFrame);
    if (i < 0) i = ns.length - 1;
    const j = d > 0 && i === ns.length - 1 ? 0 : Math.min(Math.max(i + d, 0), ns.length - 1);
    if (gd._tgPlaying) pause(gd);
    gd._tgFrame = ns[j];
    window.Plotly.animate(gd, [ns[j]], still);
  }
  function selectPath(gd, pt) {
    const m = meta(gd);
    const v = pt.customdata;
    if (!m || typeof v !== "number") return;
    const xs = [], ys = [];
    for (let u = v; u >= 0 && m.pos[u]; u = m.parents[u]) {
      xs.push(m.pos[u][0]);
      ys.push(m.pos[u][1]);
    }
    gd._tgSelected = v;
    window.Plotly.restyle(gd, { x: [xs], y: [ys] }, [m.selected]);
  }
  function openRound(gd, pt) {
    const holder = gd.closest("#timeline-plot, #compare-timeline-a, #compare-timeline-b");
    const box = document.querySelector("#plot-click textarea, #plot-click input");
    if (!holder || !box || pt.x == null) return;
    box.value = `${holder.id}:${Math.round(pt.x)}:${Date.now()}`;
    box.dispatchEvent(new Event("input", { bubbles: true }));
  }
  function onClick(gd, e) {
    const pt = e && e.points && e.points[0];
    const m = meta(gd);
    if (!pt || !m) return;
    if (m.kind === "tree") selectPath(gd, pt);
    else if (m.kind === "timeline") openRound(gd, pt);
  }
  function hook(gd) {
    if (gd._tgHooked || !gd.on) return;
    gd._tgHooked = true;
    gd.on("plotly_afterplot", () => setTimeout(() => syncFrames(gd), 0));
    gd.on("plotly_click", (e) => onClick(gd, e));
    gd.on("plotly_animating", () => { gd._tgPlaying = true; });
    gd.on("plotly_animatingframe", (e) => { gd._tgFrame = e.name; });
    gd.on("plotly_animated", () => { gd._tgPlaying = false; });
    gd.on("plotly_animationinterrupted", () => { gd._tgPlaying = false; });
    gd.addEventListener("mouseenter", () => { if ((meta(gd) || {}).kind === "tree") tg.active = gd; });
  }
  document.addEventListener("change", (e) => {  // a picked gallery trace: give the keys back to the page
    if (e.target && e.target.closest && e.target.closest("#gallery")) e.target.blur();
  });
  setInterval(() => {
    for (const gd of document.querySelectorAll(".js-plotly-plot")) {
      hook(gd);
      syncFrames(gd);
    }
  }, 250);
  function activeTree() {
    const shown = (gd) => gd && gd.isConnected && gd.offsetParent !== null && names(gd).length;
    if (shown(tg.active)) return tg.active;
    const all = document.querySelectorAll("#tree-plot .js-plotly-plot, #compare-tree-a .js-plotly-plot, #compare-tree-b .js-plotly-plot");
    return [...all].find(shown) || null;
  }
  tg.play = (gd) => play(gd || activeTree());
  tg.step = (d, gd) => stepBy(gd || activeTree(), d);
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    const tag = ((t && t.tagName) || "").toLowerCase();
    const choice = tag === "input" && ["radio", "checkbox"].includes(t.type);  // e.g. just picked a gallery trace
    if ((["input", "textarea", "select", "button"].includes(tag) && !choice) || (t && t.isContentEditable)) return;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const present = document.querySelector("#present input[type=checkbox]");
    if (present && (e.key === "p" || (e.key === "Escape" && document.body.classList.contains("tg-present")))) {
      present.click();
      return;
    }
    const gd = activeTree();
    if (!gd) return;
    if (e.key === " ") {
      e.preventDefault();
      gd._tgPlaying ? pause(gd) : play(gd);
    } else if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
      e.preventDefault();
      stepBy(gd, e.key === "ArrowRight" ? 1 : -1);
    }
  });
}
