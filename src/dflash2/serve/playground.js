// dflash2 playground (see playground.html for the contract): streams a chat answer from
// /v1/chat/completions and colours every token by its origin ("draft", "lookup", "target" or "plain",
// from the `origins` extension that `return_token_ids` turns on).
"use strict";

const $ = (id) => document.getElementById(id);
const model = document.body.dataset.model;
const state = { messages: [], controller: null };

if (document.body.dataset.auth !== "yes") $("key-label").style.display = "none";
$("api-key").value = localStorage.getItem("dflash2-api-key") || "";

function setStatus(text) { $("status").textContent = text; document.body.dataset.status = text; }

function turn(role) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  div.innerHTML = `<div class="who">${role}</div><div class="text"></div>`;
  $("log").appendChild(div);
  return div.querySelector(".text");
}

function showStats(s) {
  $("stat-tokens").textContent = s.tokens;
  $("stat-draft").textContent = s.draft;
  $("stat-lookup").textContent = s.lookup;
  $("stat-tps").textContent = s.tps === null ? "–" : s.tps.toFixed(1);
  $("stat-al").textContent = s.al === null ? "–" : s.al.toFixed(2);
  $("stat-ttft").textContent = s.ttft === null ? "–" : (s.ttft * 1000).toFixed(0) + " ms";
}

function requestBody() {
  const body = { model, messages: state.messages, stream: true, stream_options: { include_usage: true },
                 return_token_ids: true, max_tokens: parseInt($("max-tokens").value, 10) || 128,
                 temperature: parseFloat($("temperature").value) || 0 };
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = parseInt(seed, 10);
  return body;
}

async function send(text) {
  state.messages.push({ role: "user", content: text });
  turn("user").textContent = text;
  const out = turn("assistant");
  const counts = { draft: 0, lookup: 0, target: 0, plain: 0 };
  const stats = { tokens: 0, draft: 0, lookup: 0, tps: null, al: null, ttft: null };
  const started = performance.now();
  let answer = "";
  showStats(stats);
  setStatus("streaming");
  $("send").disabled = true; $("stop").disabled = false;
  state.controller = new AbortController();
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) { headers.Authorization = "Bearer " + key; localStorage.setItem("dflash2-api-key", key); }
  try {
    const response = await fetch("/v1/chat/completions", { method: "POST", headers,
      body: JSON.stringify(requestBody()), signal: state.controller.signal });
    if (!response.ok) {
      const err = await response.json().catch(() => ({ error: { message: response.statusText } }));
      throw new Error(`${response.status}: ${err.error ? err.error.message : response.statusText}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let finished = false;
    while (!finished) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") { finished = true; break; }
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.dflash2) {   // the usage chunk: the server's exact figures
            stats.al = chunk.dflash2.speculative_cycles ? chunk.dflash2.acceptance_length : stats.al;
            stats.tps = chunk.dflash2.tokens_per_second;
            stats.ttft = chunk.dflash2.time_to_first_token_s;
            stats.tokens = chunk.usage.completion_tokens;
          }
          for (const choice of chunk.choices || []) {
            const origins = choice.origins || [];
            for (const o of origins) counts[o] = (counts[o] || 0) + 1;
            stats.tokens += origins.length;
            stats.draft = counts.draft;
            stats.lookup = counts.lookup;
            if (stats.ttft === null && origins.length) stats.ttft = (performance.now() - started) / 1000;
            stats.tps = stats.tokens / ((performance.now() - started) / 1000);
            stats.al = counts.target ? (counts.draft + counts.lookup + counts.target) / counts.target : null;
            const text = choice.delta && choice.delta.content;
            if (text) {
              const span = document.createElement("span");
              span.className = "tok " + (origins[origins.length - 1] || "target");
              span.title = `${origins.join(", ")} · token ids ${(choice.token_ids || []).join(", ")}`;
              span.textContent = text;
              out.appendChild(span);
              answer += text;
            }
          }
          showStats(stats);
          $("log").scrollTop = $("log").scrollHeight;
        }
      }
    }
    state.messages.push({ role: "assistant", content: answer });
    out.dataset.text = answer;
    setStatus("done");
  } catch (err) {
    const line = document.createElement("div");
    line.className = "error";
    line.textContent = err.name === "AbortError" ? "(stopped)" : "error: " + err.message;
    out.appendChild(line);
    if (err.name !== "AbortError") state.messages.pop();   // the failed user turn is not history
    setStatus(err.name === "AbortError" ? "done" : "error");
  } finally {
    $("send").disabled = false; $("stop").disabled = true;
    state.controller = null;
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("message").value.trim();
  if (!text || state.controller) return;
  $("message").value = "";
  send(text);
});
$("message").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("clear").addEventListener("click", () => { state.messages = []; $("log").innerHTML = ""; setStatus("idle"); });
