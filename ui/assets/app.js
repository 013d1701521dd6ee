// Riffle's live view: renders the snapshots the server sends over /events.
"use strict";

const PALETTE = ["#ff4d4d", "#4dd2ff", "#ffd24d", "#7dff4d", "#ff4dd2", "#4d7dff", "#ff9f4d", "#b84dff"];
const cameras = new Map(); // camera id -> { canvas, caption, version, image }
const $ = (id) => document.getElementById(id);

function fmt(n) {
  if (typeof n !== "number") return String(n);
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

// Detections are lists of objects with x1, y1, x2, y2 (source pixels) in a result row.
function detectionsOf(row) {
  for (const value of Object.values(row || {})) {
    if (Array.isArray(value) && value.length > 0 && typeof value[0] === "object" && value[0] !== null && "x1" in value[0]) {
      return value;
    }
  }
  return [];
}

function colourOf(d, i) {
  const key = d.track_id ?? d.class_id ?? i;
  return PALETTE[Math.abs(Number(key) || 0) % PALETTE.length];
}

function cameraCard(id) {
  let cam = cameras.get(id);
  if (cam) return cam;
  const empty = $("cameras").querySelector(".empty");
  if (empty) empty.remove();
  const card = document.createElement("div");
  card.className = "camera";
  const canvas = document.createElement("canvas");
  canvas.width = 640;
  canvas.height = 360;
  canvas.dataset.camera = id;
  canvas.className = "camera-frame";
  const caption = document.createElement("div");
  caption.className = "caption";
  caption.textContent = id;
  const video = document.createElement("video");
  video.muted = true;
  video.playsInline = true;
  video.className = "camera-video";
  video.dataset.camera = id;
  video.hidden = true;
  const toggle = document.createElement("button");
  toggle.className = "play";
  toggle.hidden = true;
  toggle.textContent = "▶ video";
  card.append(canvas, video, caption, toggle);
  card.dataset.camera = id;
  // Cards in camera order, whatever order the cameras first showed up in.
  const after = [...$("cameras").children].find((c) => c.dataset.camera > id);
  $("cameras").insertBefore(card, after || null);
  cam = { canvas, caption, version: 0, loading: 0 };
  cameras.set(id, cam);
  offerVideo(id, video, canvas, toggle);
  return cam;
}

// A `video` sink's live HLS for this camera, when there is one: a button switches the card
// from sampled stills to the annotated video at its full frame rate.
function offerVideo(id, video, canvas, toggle) {
  const base = `/video/${encodeURIComponent(id)}/live/`;
  const probe = () =>
    fetch(base + "index.m3u8", { method: "HEAD", cache: "no-store" })
      .then((r) => { if (r.ok) toggle.hidden = false; else setTimeout(probe, 5000); })
      .catch(() => setTimeout(probe, 5000));
  probe();
  let playing = null;
  toggle.onclick = () => {
    const on = video.hidden;
    video.hidden = !on;
    canvas.hidden = on;
    toggle.textContent = on ? "■ stills" : "▶ video";
    if (on) playing = playLive(video, base);
    else if (playing) playing.stop();
  };
}

// The RFC 6381 codec of an H.264 init segment, from its avcC box (profile, constraints,
// level): the encoder's preset decides the profile, and MSE refuses a stream that is not the one
// it was told.
function avcCodec(bytes) {
  const b = new Uint8Array(bytes);
  for (let i = 4; i + 8 < b.length; i++) {
    if (b[i] === 0x61 && b[i + 1] === 0x76 && b[i + 2] === 0x63 && b[i + 3] === 0x43) {
      const hex = (n) => n.toString(16).padStart(2, "0");
      return `avc1.${hex(b[i + 5])}${hex(b[i + 6])}${hex(b[i + 7])}`;
    }
  }
  return "avc1.640028";
}

// Plays an HLS playlist of fragmented-MP4 segments through Media Source Extensions: the init
// segment, then each new segment in order, from near the live edge.
function playLive(video, base) {
  let stopped = false;
  const source = new MediaSource();
  video.src = URL.createObjectURL(source);
  const get = (name) => fetch(base + name, { cache: "no-store" }).then((r) => {
    if (!r.ok) throw new Error(`${name}: ${r.status}`);
    return r;
  });
  const appended = (buffer, bytes) => new Promise((resolve, reject) => {
    buffer.addEventListener("updateend", resolve, { once: true });
    buffer.addEventListener("error", reject, { once: true });
    buffer.appendBuffer(bytes);
  });
  source.addEventListener("sourceopen", async () => {
    let buffer = null;
    let next = -1;
    while (!stopped) {
      try {
        const text = await (await get("index.m3u8")).text();
        const lines = text.split("\n").map((l) => l.trim());
        const first = Number((lines.find((l) => l.startsWith("#EXT-X-MEDIA-SEQUENCE:")) || ":0").split(":")[1]);
        const target = Number((lines.find((l) => l.startsWith("#EXT-X-TARGETDURATION:")) || ":2").split(":")[1]);
        const segments = lines.filter((l) => l && !l.startsWith("#"));
        // The sink started the stream over (a new size, a restarted run): its numbers begin
        // again, after a new init segment.
        const restarted = buffer && next > first + segments.length;
        if (segments.length && (!buffer || restarted)) {
          const map = lines.find((l) => l.startsWith("#EXT-X-MAP:"));
          const init = map ? map.split('URI="')[1].split('"')[0] : "init.mp4";
          const bytes = await (await get(init)).arrayBuffer();
          if (!bytes.byteLength) throw new Error("init segment not written yet");
          if (!buffer) {
            buffer = source.addSourceBuffer(`video/mp4; codecs="${avcCodec(bytes)}"`);
            // Segments play one after another whatever their times: a stream started over
            // runs on from where the last one ended.
            buffer.mode = "sequence";
          }
          await appended(buffer, bytes);
          next = first + Math.max(0, segments.length - 2);
        }
        if (!buffer) throw new Error("no segment yet");
        if (next < first) next = first; // fell behind the window: skip ahead
        for (let seq = next; seq < first + segments.length && !stopped; seq++) {
          await appended(buffer, await (await get(segments[seq - first])).arrayBuffer());
          next = seq + 1;
          if (video.paused && buffer.buffered.length) {
            video.currentTime = buffer.buffered.start(0);
            video.play().catch(() => {});
          }
        }
        // Keep about a minute: a long watch does not grow the page's memory.
        if (buffer.buffered.length && video.currentTime - buffer.buffered.start(0) > 60) {
          buffer.remove(0, video.currentTime - 30);
          await new Promise((r) => buffer.addEventListener("updateend", r, { once: true }));
        }
        await new Promise((r) => setTimeout(r, Math.max(250, target * 500)));
      } catch (e) {
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }, { once: true });
  return { stop() { stopped = true; video.pause(); video.removeAttribute("src"); video.load(); } };
}

function drawCamera(cam, view, image) {
  const { canvas } = cam;
  const row = view.row || {};
  const sourceW = Number(row.width) || image.naturalWidth;
  const sourceH = Number(row.height) || image.naturalHeight;
  // Resizing a canvas reallocates it: only when the picture's shape changes.
  const height = Math.max(1, Math.round(640 * image.naturalHeight / image.naturalWidth));
  if (canvas.width !== 640 || canvas.height !== height) {
    canvas.width = 640;
    canvas.height = height;
  }
  const ctx = canvas.getContext("2d");
  ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
  const sx = canvas.width / sourceW, sy = canvas.height / sourceH;
  const drawn = [];
  ctx.lineWidth = 3;
  ctx.font = "13px system-ui, sans-serif";
  detectionsOf(row).forEach((d, i) => {
    const x = d.x1 * sx, y = d.y1 * sy, w = (d.x2 - d.x1) * sx, h = (d.y2 - d.y1) * sy;
    const colour = colourOf(d, i);
    ctx.strokeStyle = colour;
    ctx.strokeRect(x, y, w, h);
    const label = [d.label ?? d.class_id, d.score != null ? Number(d.score).toFixed(2) : null, d.track_id != null ? "#" + d.track_id : null]
      .filter((p) => p != null).join(" ");
    const tw = ctx.measureText(label).width + 6;
    ctx.fillStyle = colour;
    ctx.fillRect(x - 1.5, Math.max(0, y - 17), tw, 16);
    ctx.fillStyle = "#000";
    ctx.fillText(label, x + 2, Math.max(12, y - 4));
    drawn.push({ x: Math.round(x), y: Math.round(y), w: Math.round(w), h: Math.round(h), colour });
  });
  canvas.dataset.frame = String(view.frame);
  canvas.dataset.version = String(view.version);
  canvas.dataset.boxes = String(drawn.length);
  canvas.dataset.drawn = JSON.stringify(drawn);
  cam.caption.textContent = `${view.camera_id} · frame ${view.frame} · ${drawn.length} detection${drawn.length === 1 ? "" : "s"} · ${fmt(view.shown)} shown`;
}

// Pictures that loaded are drawn together at the next animation frame: one repaint for all
// cameras instead of one each (a repaint is most of what the page costs).
const pendingDraws = new Map();
function queueDraw(cam, view, image) {
  if (pendingDraws.size === 0) {
    requestAnimationFrame(() => {
      for (const [c, [v, img]] of pendingDraws) drawCamera(c, v, img);
      pendingDraws.clear();
    });
  }
  pendingDraws.set(cam, [view, image]);
}

function renderCameras(list) {
  for (const view of list) {
    const cam = cameraCard(view.camera_id);
    // One picture in flight per camera: a slow browser skips versions, never queues them.
    if (view.version === cam.version || cam.loading) continue;
    cam.loading = view.version;
    const image = new Image();
    image.onload = () => { cam.loading = 0; cam.version = view.version; queueDraw(cam, view, image); };
    image.onerror = () => { cam.loading = 0; cam.version = view.version; };
    image.src = `/frame?camera=${encodeURIComponent(view.camera_id)}&v=${view.version}`;
  }
}

// Live cameras' riffle_video_camera_up: a card says "down" (one that never came up gets an
// empty card saying so), or "ended" for a file played to its end.
function renderCameraHealth(connectors) {
  for (const [k, v] of Object.entries(connectors)) {
    const m = /^riffle_video_camera_up\{camera=(.*)\}$/.exec(k);
    if (!m) continue;
    const cam = cameraCard(m[1]);
    const ended = connectors[`riffle_video_camera_ended{camera=${m[1]}}`] > 0;
    cam.caption.parentElement.dataset.up = v > 0 ? "1" : ended ? "ended" : "0";
  }
}

const history = new Map(); // stage name -> points (t ascending), at most HISTORY
const HISTORY = 240;
const stageRows = new Map(); // stage name -> { cells, rate, lat }

// Snapshots carry the latest few points of each chart; the page keeps two minutes of them.
function remember(name, points) {
  const kept = history.get(name) || [];
  const last = kept.length ? kept[kept.length - 1].t : -1;
  for (const p of points) if (p.t > last) kept.push(p);
  if (kept.length > HISTORY) kept.splice(0, kept.length - HISTORY);
  history.set(name, kept);
  return kept;
}

function drawSparkline(canvas, points, keys, colours) {
  const { width, height } = canvas;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1e-9, ...points.flatMap((p) => keys.map((k) => p[k])));
  keys.forEach((k, j) => {
    ctx.strokeStyle = colours[j];
    ctx.beginPath();
    points.forEach((p, i) => {
      const x = points.length > 1 ? (i / (points.length - 1)) * (width - 2) + 1 : 1;
      const y = height - 2 - (p[k] / max) * (height - 4);
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
  });
}

function stageRow(name) {
  let row = stageRows.get(name);
  if (row) return row;
  const tr = document.createElement("tr");
  tr.dataset.stage = name;
  const cells = ["", "in", "out", "dead", "late", "batches", "mean"].map((key, i) => {
    const td = document.createElement("td");
    if (i === 0) td.textContent = name; else { td.className = "num"; td.dataset.key = key; }
    tr.append(td);
    return td;
  });
  const chart = () => { const c = document.createElement("canvas"); c.width = 160; c.height = 34; return c; };
  const rate = { td: document.createElement("td"), canvas: chart(), text: document.createTextNode("") };
  const lat = { td: document.createElement("td"), canvas: chart(), text: document.createTextNode("") };
  for (const c of [rate, lat]) { c.td.append(c.canvas, c.text); tr.append(c.td); }
  $("stages").querySelector("tbody").append(tr);
  row = { cells, rate, lat };
  stageRows.set(name, row);
  return row;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function renderStages(stages) {
  for (const s of stages) {
    const row = stageRow(s.name);
    const points = remember(s.name, s.series);
    [s.records_in, s.records_out, s.dead_letters, s.late, s.batches, s.mean_batch]
      .forEach((v, i) => setText(row.cells[i + 1], fmt(v)));
    const last = points.length ? points[points.length - 1] : { rate: 0, p50_ms: 0, p99_ms: 0 };
    drawSparkline(row.rate.canvas, points, ["rate"], ["#3fb68b"]);
    setText(row.rate.text, fmt(last.rate));
    drawSparkline(row.lat.canvas, points, ["p50_ms", "p99_ms"], ["#4dd2ff", "#ff9f4d"]);
    setText(row.lat.text, `${last.p50_ms.toFixed(2)} / ${last.p99_ms.toFixed(2)}`);
  }
}

function cell(value) {
  const td = document.createElement("td");
  td.textContent = typeof value === "object" && value !== null ? JSON.stringify(value) : String(value ?? "");
  td.title = td.textContent.slice(0, 2000);
  return td;
}

const shownRows = new WeakMap(); // table -> the rows it shows, as JSON

function renderRows(table, rows, columns) {
  // Unchanged since the last snapshot (a finished run, a quiet stream): nothing to redo.
  const key = JSON.stringify(rows);
  if (shownRows.get(table) === key) return;
  shownRows.set(table, key);
  const keys = columns || [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const head = table.querySelector("thead");
  if (!columns) {
    const tr = document.createElement("tr");
    keys.forEach((k) => { const th = document.createElement("th"); th.textContent = k; tr.append(th); });
    head.replaceChildren(tr);
  }
  const body = table.querySelector("tbody");
  body.replaceChildren(...rows.map((r) => { const tr = document.createElement("tr"); keys.forEach((k) => tr.append(cell(r[k]))); return tr; }));
}

let lastTables = -Infinity;

function render(s) {
  $("pipeline").textContent = s.about.pipeline;
  document.title = `Riffle · ${s.about.pipeline}`;
  const status = $("status");
  status.textContent = s.finished ? "finished (final state)" : s.ready ? "running" : "starting";
  status.className = "status " + (s.finished ? "finished" : s.ready ? "running" : "");
  $("results").textContent = fmt(s.results_seen);
  $("results").dataset.value = String(s.results_seen);
  $("dead").textContent = fmt(s.dead_letters_seen);
  $("late").textContent = fmt(s.stages.reduce((a, st) => a + st.late, 0));
  $("processes").textContent = `${s.processes.length} of ${s.about.processes}`;
  $("uptime").textContent = `${Math.round(s.uptime_s)} s`;
  $("plan").textContent = s.about.plan;
  renderCameras(s.cameras);
  renderCameraHealth(s.connectors);
  renderStages(s.stages);
  // Tables of rows are rebuilt at most every 2 s (each snapshot would cost the browser more).
  const now = performance.now();
  if (s.finished || now - lastTables >= 1900) {
    lastTables = now;
    renderRows($("rows"), s.rows);
    renderRows($("dead-letters"), s.dead_letters, ["stage", "reason", "record"]);
  }
  const conn = Object.entries(s.connectors).map(([k, v]) => ({ k, v }));
  for (const p of s.processes) conn.push({ k: `process ${p.process}`, v: `${p.finished ? "finished" : p.ready ? "ready" : "starting"}, ${fmt(p.rss_bytes / 1048576)} MiB` });
  renderRows($("connectors"), conn, ["k", "v"]);
}

function connect() {
  const events = new EventSource("/events");
  // At most one repaint a second: painting is what the page costs, and a second is live
  // enough for charts and counters. The newest snapshot waits for its turn; older ones are
  // dropped (charts lose nothing: each snapshot carries the last few points).
  let latest = null;
  let timer = null;
  let last = -Infinity;
  const paint = () => {
    timer = null;
    last = performance.now();
    if (latest) render(JSON.parse(latest));
    latest = null;
  };
  events.onmessage = (e) => {
    if (!e.data || e.data === "{}") return;
    latest = e.data;
    if (timer === null) timer = setTimeout(paint, Math.max(0, 1000 - (performance.now() - last)));
  };
  events.onerror = () => {
    const status = $("status");
    status.textContent = "connection lost; retrying";
    status.className = "status lost";
  };
}

connect();
