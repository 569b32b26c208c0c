// Live preview for the "add a spam rule" form: as the pasted URL or the chosen level
// changes, ask the staff-only preview endpoint which expressions are possible and
// which sample URLs the chosen one would block. Without JavaScript the "Preview"
// button gives the same answer through a normal form post.
"use strict";
(function () {
  var form, urlInput, choices, body, timer, lastQuery = null;

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  function chosen() {
    var checked = form.querySelector('input[name="expression"]:checked');
    return checked ? checked.value : "";
  }

  function renderChoices(data) {
    var keep = chosen();
    choices.textContent = "";
    data.candidates.forEach(function (c, i) {
      var id = "id_expression_" + i;
      var wrap = el("div", {"class": "choice"});
      var label = el("label", {"for": id});
      var radio = el("input", {type: "radio", name: "expression", value: c.expression, id: id});
      if (c.expression === (keep || data.expression)) { radio.checked = true; }
      label.appendChild(radio);
      label.appendChild(document.createTextNode(" " + c.expression + " — " + c.help));
      wrap.appendChild(label);
      choices.appendChild(wrap);
    });
    if (!data.candidates.length) {
      choices.appendChild(el("p", {"class": "help"}, "No expression: see the preview below."));
    }
  }

  function renderPreview(data) {
    body.textContent = "";
    if (data.error) {
      body.appendChild(el("p", {"class": "errornote preview-error"}, data.error));
      return;
    }
    var p = el("p", {}, "Rule: ");
    p.appendChild(el("code", {"class": "preview-expression"}, data.expression));
    body.appendChild(p);
    if (data.impact) { body.appendChild(renderImpact(data.impact)); }
    renderConfirmations(data.confirmations || []);
    if (data.existing.length) {
      body.appendChild(el("p", {"class": "preview-existing warning"}, "Already blocked by: " +
        data.existing.map(function (r) { return r.expression + " (" + r.category + ")"; }).join(", ")));
    }
    var cols = el("div", {"class": "preview-columns"});
    [["Would block", "preview-blocked", true], ["Would not block", "preview-allowed", false]]
      .forEach(function (spec) {
        var col = el("div");
        col.appendChild(el("h3", {}, spec[0]));
        var ul = el("ul", {"class": spec[1]});
        data.samples.forEach(function (s) {
          if (s.blocked === spec[2]) {
            var li = el("li");
            li.appendChild(el("code", {}, s.url));
            ul.appendChild(li);
          }
        });
        col.appendChild(ul);
        cols.appendChild(col);
      });
    body.appendChild(cols);
  }

  function renderImpact(impact) {
    var box = el("div", {"class": "impact" + (impact.links ? " impact-some" : ""),
                         "data-action": impact.action});
    box.appendChild(el("p", {"class": "impact-text"}, impact.text));
    if (impact.samples && impact.samples.length) {
      var ul = el("ul", {"class": "impact-samples"});
      impact.samples.forEach(function (s) {
        var li = el("li");
        li.appendChild(el("span", {}, "/" + s.slug + " → "));
        li.appendChild(el("code", {}, s.destination));
        if (s.other_rule) {
          var other = el("span", {"class": "impact-other"},
                         " " + (impact.action === "remove" ? "still" : "already") + " blocked by ");
          other.appendChild(el("code", {}, s.other_rule));
          li.appendChild(other);
        }
        ul.appendChild(li);
      });
      box.appendChild(ul);
    }
    return box;
  }

  function renderConfirmations(list) {
    var row = document.getElementById("confirm-row");
    var reasons = document.getElementById("confirm-reasons");
    if (!row || !reasons) { return; }
    reasons.textContent = "";
    list.forEach(function (c) {
      reasons.appendChild(el("li", {"data-code": c.code}, c.reason));
    });
    row.hidden = list.length === 0;
  }

  function refresh() {
    var text = urlInput.value.trim();
    if (!text) { return; }
    var params = new URLSearchParams({url: text});
    var expr = chosen();
    if (expr) { params.set("expression", expr); }
    form.querySelector('textarea[name="samples"]').value.split(/\r?\n/).forEach(function (s) {
      if (s.trim()) { params.append("sample", s.trim()); }
    });
    var query = params.toString();
    if (query === lastQuery) { return; }
    lastQuery = query;
    fetch(form.getAttribute("data-preview-url") + "?" + query,
          {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) {
        // An expired session answers with the login page (HTML), not JSON.
        var json = (r.headers.get("Content-Type") || "").indexOf("application/json") === 0;
        if (!json) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (data) {
        if (query !== lastQuery) { return; }  // a newer request is on its way
        renderChoices(data);
        renderPreview(data);
      })
      .catch(function (err) {
        lastQuery = null;
        renderPreview({error: "The live preview is unavailable (" + err.message + "). Press " +
                       "“Preview” below; if your session has expired, you will be asked " +
                       "to log in again."});
      });
  }

  function later() { clearTimeout(timer); timer = setTimeout(refresh, 250); }

  document.addEventListener("DOMContentLoaded", function () {
    form = document.getElementById("add-rule-form");
    if (!form) { return; }
    urlInput = form.querySelector('input[name="url"]');
    choices = document.getElementById("expression-choices");
    body = document.getElementById("preview-body");
    urlInput.addEventListener("input", later);
    form.querySelector('textarea[name="samples"]').addEventListener("input", later);
    choices.addEventListener("change", function () { lastQuery = null; refresh(); });
    if (urlInput.value.trim()) { refresh(); }
  });
})();
