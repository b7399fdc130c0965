// qkov serve: the page. Every string from the model or the user is inserted with textContent
// (never as HTML); the view's state lives in the address (#text=...&head=...). The sequence shown is
// a typed text, or a row of the user's data (#row=...) scored against its own targets.
'use strict';

var state = { text: '', row: null, head: '', pos: null, token: null, role: 'source', writer: '', reader: '', kind: 'K', mode: 'attention' };
var model = null, run = null, scores = null, data = null, dataOffset = 0;
var DATA_PAGE = 50;

function $(id) { return document.getElementById(id); }
function el(tag, attrs, children) {
  var node = document.createElement(tag);
  Object.keys(attrs || {}).forEach(function (k) {
    if (k === 'text') node.textContent = attrs[k];
    else if (k === 'cls') node.className = attrs[k];
    else if (k === 'onclick') node.addEventListener('click', attrs[k]);
    else node.setAttribute(k, attrs[k]);
  });
  (children || []).forEach(function (c) { node.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
  return node;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
function shown(s) { return s.replace(/\n/g, '↵').replace(/\t/g, '⇥'); }
function fmt(x, digits) { return x === null || x === undefined ? '—' : Number(x).toFixed(digits === undefined ? 3 : digits); }
function chip(t) { return el('span', { cls: 'chip', title: '#' + t.id, text: shown(t.str) }); }
function sleep(ms) { return new Promise(function (r) { setTimeout(r, ms); }); }
function showError(message) { $('error').textContent = message || ''; }

// -- the address holds the state --------------------------------------------------------------
function saveState() {
  var params = new URLSearchParams();
  Object.keys(state).forEach(function (k) { if (state[k] !== null && state[k] !== '') params.set(k, state[k]); });
  history.replaceState(null, '', '#' + params.toString());
}
function loadState() {
  var params = new URLSearchParams(location.hash.slice(1));
  Object.keys(state).forEach(function (k) {
    if (!params.has(k)) return;
    var v = params.get(k);
    state[k] = (k === 'pos' || k === 'token' || k === 'row') ? parseInt(v, 10) : v;
  });
}

// -- requests: a long one shows its progress and can be cancelled -------------------------------
function api(path, label) {
  var controller = new AbortController();
  var jobId = null;
  var bar = el('progress', { max: '1', value: '0' });
  var stage = el('span', { text: '' });
  var box = el('div', { cls: 'job' }, [label + ' ', bar, stage, ' ', el('button', { text: 'cancel', onclick: function () {
    controller.abort();
    if (jobId) fetch('/api/jobs/' + jobId, { method: 'DELETE' });
  } })]);
  var shownTimer = setTimeout(function () { $('jobs').appendChild(box); }, 150);
  async function go() {
    var response = await fetch(path, { signal: controller.signal });
    var body = await read(response);
    while (response.status === 202) {
      jobId = body.job;
      bar.max = body.total; bar.value = body.done; stage.textContent = body.stage;
      await sleep(250);
      response = await fetch('/api/jobs/' + jobId, { signal: controller.signal });
      body = await read(response);
    }
    if (!response.ok) throw new Error(body.error || ('HTTP ' + response.status));
    return body;
  }
  return go().finally(function () { clearTimeout(shownTimer); box.remove(); });
}
async function read(response) {  // JSON, or the server's plain-text error as {error}
  var text = await response.text();
  try { return JSON.parse(text); } catch (e) { return { error: 'HTTP ' + response.status + ': ' + text.slice(0, 200) }; }
}
function report(err) { showError(err.name === 'AbortError' ? 'cancelled' : err.message); }
function query(params) { return new URLSearchParams(params).toString(); }

// -- a sequence (typed, or a row of the data): tokens, attention, loss, path expansion ---------
function runText() {
  state.text = $('text').value;
  state.row = null;
  return showSequence('/api/text?' + query({ text: state.text }), 'running the text', 'typed text');
}

function runRow(row) {
  state.row = row;
  return showSequence('/api/data/row?' + query({ row: row }), 'running row ' + row, 'data row ' + row);
}

function showSequence(path, label, source) {
  saveState();
  showError('');
  return api(path, label).then(function (body) {
    run = body;
    if (state.pos !== null && state.pos >= run.tokens.length) state.pos = null;
    drawTokens();
    drawPositions();
    drawDataRows();
    var scored = run.loss.filter(function (x) { return x !== null; }).length;
    $('text-summary').textContent = source + ': ' + run.tokens.length + ' tokens, ' + (run.mean_loss === null ? 'no loss' :
      'mean loss ' + fmt(run.mean_loss) + ' nats, accuracy ' + fmt(run.accuracy) + ' over ' + scored + (scored === 1 ? ' position' : ' positions') + ' with a target');
    $('no-loss').textContent = run.no_loss || '';
    if (state.pos !== null) showPaths();
  }).catch(report);
}

function verdict(i) { return run.correct[i] === null ? 'no target' : (run.correct[i] ? '✓' : '✗'); }

function drawPositions() {
  var rows = run.tokens.map(function (t, i) {
    return el('tr', { cls: run.correct[i] === false ? 'wrong' : '' }, [el('td', { cls: 'num', text: String(i) }),
      el('td', {}, [chip(t)]), el('td', {}, run.target[i] ? [chip(run.target[i])] : ['no target']),
      el('td', {}, [chip(run.prediction[i])]), el('td', { cls: 'num', text: fmt(run.loss[i]) }), el('td', { text: verdict(i) })]);
  });
  $('positions-box').open = run.tokens.length <= 40;
  clear($('positions')).appendChild(table(['position', 'token', 'target', 'prediction', 'loss', 'correct'], rows));
}

function drawTokens() {
  var box = clear($('tokens'));
  if (!run) return;
  run.tokens.forEach(function (t, i) {
    var span = el('span', { cls: 'tok', text: shown(t.str) });
    span.dataset.about = '#' + t.id + ' at ' + i + ' · predicts ' + shown(run.prediction[i].str) + ' · target ' +
      (run.target[i] ? shown(run.target[i].str) + ' · loss ' + fmt(run.loss[i], 2) + ' ' + verdict(i) : 'none');
    span.title = span.dataset.about;
    span.classList.toggle('no-target', run.target[i] === null);
    span.addEventListener('mouseenter', function () { paint(i); });
    span.addEventListener('click', function () { selectPosition(i); });
    box.appendChild(span);
  });
  paint(null);
}

function paint(hover) {
  var spans = $('tokens').children;
  var pattern = run && state.head ? run.patterns[state.head] : null;
  var maxLoss = run ? Math.max.apply(null, run.loss.map(function (x) { return x || 0; }).concat([1e-9])) : 1;
  for (var i = 0; i < spans.length; i++) {
    var span = spans[i], bg = 'transparent', under = '#e4e4e4';
    if (state.mode === 'loss') {
      bg = 'rgba(214,39,40,' + ((run.loss[i] || 0) / maxLoss).toFixed(3) + ')';
    } else if (pattern && hover !== null) {
      if (i <= hover) bg = 'rgba(31,119,180,' + pattern[hover][i] + ')';
      if (i >= hover) under = 'rgba(214,39,40,' + pattern[i][hover] + ')';
    }
    span.style.background = bg;
    span.style.borderBottomColor = under;
    // the weights behind the colours, on hover: what the hovered token gives this one, and takes from it
    var weights = [];
    if (state.mode !== 'loss' && pattern && hover !== null) {
      if (i <= hover) weights.push('attention of ' + hover + ' to it: ' + fmt(pattern[hover][i], 3));
      if (i >= hover) weights.push('its attention to ' + hover + ': ' + fmt(pattern[i][hover], 3));
    }
    span.title = span.dataset.about + (weights.length ? ' · ' + state.head + ' ' + weights.join(', ') : '');
    span.classList.toggle('hovered', i === hover);
    span.classList.toggle('selected', i === state.pos);
  }
  var status = $('attention-status');
  if (state.mode === 'loss') {
    status.textContent = run && run.mean_loss === null ? 'No loss: ' + (run.no_loss || 'no position has a target') + '.' :
      'Red: loss of each position\'s prediction against its target (hover for the number); dashed: no target.';
    return;
  }
  if (!pattern || hover === null) {
    status.textContent = state.head ? state.head + ': hover a token to see where it attends.' : 'Click a head, then hover a token.';
    return;
  }
  var row = pattern[hover], to = row.indexOf(Math.max.apply(null, row));
  var from = hover, best = -1;
  for (var d = hover; d < pattern.length; d++) if (pattern[d][hover] > best) { best = pattern[d][hover]; from = d; }
  status.textContent = state.head + ': token ' + hover + ' ' + JSON.stringify(shown(run.tokens[hover].str)) +
    ' attends most to ' + to + ' ' + JSON.stringify(shown(run.tokens[to].str)) + ' (' + fmt(row[to], 2) + '); ' +
    'attended most by ' + from + ' ' + JSON.stringify(shown(run.tokens[from].str)) + ' (' + fmt(best, 2) + ').';
}

function selectPosition(i) {
  state.pos = i;
  state.token = run.tokens[i].id;
  saveState();
  paint(i);
  showPaths();
  showToken();
}

function showPaths() {
  var box = clear($('paths'));
  var k = Math.min(5, model.d_out);
  var path = state.row === null ? '/api/paths?' + query({ text: state.text, pos: state.pos, k: k }) :
    '/api/data/paths?' + query({ row: state.row, pos: state.pos, k: k });
  api(path, 'expanding the logits into paths').then(function (body) {
    var what = body.target ? 'the target ' + JSON.stringify(shown(body.target.str)) : 'the prediction (this position has no target)';
    box.appendChild(el('h3', { text: 'Path expansion at position ' + body.position + ' ' + JSON.stringify(shown(body.token.str)) }));
    box.appendChild(el('p', { cls: 'small', text: 'The model predicts ' + JSON.stringify(shown(body.predicted.str)) +
      ' (logit ' + fmt(body.predicted.logit, 2) + '). Each path\'s share of the logits, sorted by its logit for ' + what + '.' }));
    var rows = body.terms.map(function (t) {
      return el('tr', {}, [el('td', { text: t.path }), el('td', { cls: 'num', text: fmt(t.predicted_logit, 2) }),
        el('td', { cls: 'num', text: fmt(t.target_logit, 2) }), el('td', {}, t.top.map(chip))]);
    });
    box.appendChild(table(['path', 'logit of prediction', 'logit of target', 'top outputs of this term'], rows));
  }).catch(report);
}

function table(header, rows) {
  return el('table', {}, [el('tr', {}, header.map(function (h) { return el('th', { text: h }); }))].concat(rows));
}

// -- heads -------------------------------------------------------------------------------------
function drawHeadButtons() {
  var box = clear($('head-buttons'));
  model.heads.forEach(function (name) {
    box.appendChild(el('button', { cls: 'head' + (name === state.head ? ' active' : ''), text: name, onclick: function () { selectHead(name); } }));
  });
}

function selectHead(name) {
  state.head = name;
  saveState();
  drawHeadButtons();
  $('head-name').textContent = name;
  if (run) paint(null);
  drawHeadTable();
  drawEigenvalues();
  showToken();
}

function loadScores() {
  if (model.square_reason) { $('guide').textContent = 'No head scores on repeated tokens, copying or skip-trigrams: ' + model.square_reason + '.'; return; }
  return api('/api/heads', 'head scores (eigenvalues, repeated random tokens)').then(function (body) {
    scores = body;
    drawHeadTable();
    drawEigenvalues();
    suggest();
  }).catch(report);
}

function drawHeadTable() {
  if (!scores) return;
  var rows = scores.heads.map(function (h) {
    var tr = el('tr', { cls: 'clickable' + (h.name === state.head ? ' current' : '') }, [el('td', { text: h.name }),
      el('td', { cls: 'num', text: fmt(h.previous_token_score) }), el('td', { cls: 'num', text: fmt(h.induction_score) }),
      el('td', { cls: 'num', text: fmt(h.duplicate_token_score) }), el('td', { cls: 'num', text: fmt(h.copying_score) }),
      el('td', { cls: 'num', text: fmt(h.self_top1) }), el('td', { cls: 'num', text: fmt(h.effective_rank, 1) })]);
    tr.addEventListener('click', function () { selectHead(h.name); });
    return tr;
  });
  var box = clear($('head-table'));
  box.appendChild(table(['head', 'previous-token', 'induction', 'duplicate-token', 'copying (eigenvalues)', 'own token top-1', 'OV effective rank'], rows));
  box.appendChild(el('p', { cls: 'small', text: 'Attention scores on ' + scores.repeat_period + '-token random sequences repeated 3 times. ' +
    'Copying score Re(Σλ)/Σ|λ| of the full OV circuit; random heads stay below ' + fmt(scores.copying_threshold, 2) + ' (99th percentile).' }));
}

function suggest() {
  // Names a head previous-token or induction only when analyze does (its list, its threshold).
  var strongest = function (key, heads) {
    return heads.reduce(function (a, b) { return (b[key] || 0) > (a[key] || 0) ? b : a; });
  };
  var pick = function (key, names, threshold, layers) {
    var candidates = scores.heads.filter(function (h) { return layers(h.layer); });
    var named = candidates.filter(function (h) { return names.indexOf(h.name) >= 0; });
    return { head: named.length ? strongest(key, named) : null, best: strongest(key, candidates), key: key, threshold: threshold };
  };
  var say = function (label, found) {
    if (found.head) return label + ': ' + found.head.name + ' (' + fmt(found.head[found.key], 2) + '). ';
    return label + ': none above ' + fmt(found.threshold, 2) + ' (best: ' + found.best.name + ', ' + fmt(found.best[found.key], 2) + '). ';
  };
  var last = model.config.n_layers - 1;
  if (last < 1) { $('guide').textContent = ''; return; }
  var prev = pick('previous_token_score', scores.previous_token_heads, scores.previous_token_threshold, function (l) { return l < last; });
  var ind = pick('induction_score', scores.induction_heads, scores.induction_threshold, function (l) { return l > 0; });
  var guide = clear($('guide'));
  guide.appendChild(document.createTextNode(say('Previous-token head', prev) + say('Induction head', ind)));
  if (prev.head && ind.head && prev.head.layer < ind.head.layer) {
    var writer = prev.head.name, reader = ind.head.name;
    guide.appendChild(el('button', { text: 'why does ' + reader + ' work?', onclick: function () {
      state.writer = writer; state.reader = reader; state.kind = 'K'; saveState(); setPairSelects(); showPair();
    } }));
  }
}

function drawEigenvalues() {
  var box = clear($('eigen'));
  if (!scores || !state.head) return;
  var h = scores.heads.filter(function (x) { return x.name === state.head; })[0];
  var ns = 'http://www.w3.org/2000/svg', size = 220, pad = 20;
  var limit = Math.max.apply(null, h.eigenvalues.map(function (e) { return Math.max(Math.abs(e[0]), Math.abs(e[1])); }).concat([1e-9]));
  var scale = function (v) { return size / 2 + v / limit * (size / 2 - pad); };
  var svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', size); svg.setAttribute('height', size);
  svg.setAttribute('aria-label', 'eigenvalues of ' + h.name);
  [[pad, size / 2, size - pad, size / 2], [size / 2, pad, size / 2, size - pad]].forEach(function (l) {
    var line = document.createElementNS(ns, 'line');
    line.setAttribute('x1', l[0]); line.setAttribute('y1', l[1]); line.setAttribute('x2', l[2]); line.setAttribute('y2', l[3]);
    line.setAttribute('stroke', '#aaa'); svg.appendChild(line);
  });
  h.eigenvalues.forEach(function (e) {
    var c = document.createElementNS(ns, 'circle');
    c.setAttribute('cx', scale(e[0])); c.setAttribute('cy', scale(-e[1])); c.setAttribute('r', 3);
    c.setAttribute('fill', e[0] >= 0 ? '#2ca02c' : '#9467bd');  // as the report: green copies, purple does not
    var tip = document.createElementNS(ns, 'title');
    tip.textContent = fmt(e[0], 3) + (e[1] < 0 ? ' - ' : ' + ') + fmt(Math.abs(e[1]), 3) + 'i';
    c.appendChild(tip); svg.appendChild(c);
  });
  var label = document.createElementNS(ns, 'text');
  label.setAttribute('x', 4); label.setAttribute('y', 12);
  label.textContent = 'OV eigenvalues (copying ' + fmt(h.copying_score, 2) + ')';
  svg.appendChild(label);
  box.appendChild(svg);
}

function showToken() {
  if (state.token === null || !state.head) return;
  $('token-shown').textContent = JSON.stringify(shown(tokenString(state.token))) + ' (#' + state.token + ')';
  var q = query({ token: state.token, k: 10 });
  api('/api/head/' + state.head + '/ov?' + query({ token: state.token, k: Math.min(10, model.d_out) }), 'OV circuit row').then(function (body) {
    var box = clear($('ov'));
    box.appendChild(el('h4', { text: 'OV: attending to it, ' + state.head + ' raises / lowers' }));
    var rows = body.raised.map(function (t, i) {
      var low = body.lowered[i];
      return el('tr', {}, [el('td', {}, [chip(t)]), el('td', { cls: 'num', text: fmt(t.value, 2) }),
        el('td', {}, [chip(low)]), el('td', { cls: 'num', text: fmt(low.value, 2) })]);
    });
    box.appendChild(table(['raised', 'logit', 'lowered', 'logit'], rows));
    box.appendChild(el('p', { cls: 'small', text: body.own_rank === null ? 'The outputs are classes, not tokens: no own-token rank.' :
      'Its own logit ranks ' + body.own_rank + ' of ' + model.config.d_vocab + '.' }));
  }).catch(report);
  api('/api/head/' + state.head + '/qk?' + q, 'QK circuit row').then(function (body) {
    var box = clear($('qk'));
    box.appendChild(el('h4', { text: 'QK: from it as destination, ' + state.head + ' prefers / avoids sources' }));
    var rows = body.preferred.map(function (t, i) {
      var low = body.avoided[i];
      return el('tr', {}, [el('td', {}, [chip(t)]), el('td', { cls: 'num', text: fmt(t.value, 2) }),
        el('td', {}, [chip(low)]), el('td', { cls: 'num', text: fmt(low.value, 2) })]);
    });
    box.appendChild(table(['preferred', 'score', 'avoided', 'score'], rows));
  }).catch(report);
}

function tokenString(id) {
  if (run) for (var i = 0; i < run.tokens.length; i++) if (run.tokens[i].id === id) return run.tokens[i].str;
  return tokenCache[id] !== undefined ? tokenCache[id] : '#' + id;
}
var tokenCache = {};

function showTrigrams() {
  if (state.token === null || !state.head) { showError('pick a head and a token first'); return; }
  state.role = $('trigram-role').value;
  saveState();
  var params = { k: 10 }; params[state.role] = state.token;
  api('/api/head/' + state.head + '/skip-trigrams?' + query(params), 'skip-trigrams').then(function (body) {
    var rows = body.trigrams.map(function (t) {
      return el('tr', {}, [el('td', {}, [chip(t.source)]), el('td', { text: '…' }), el('td', {}, [chip(t.destination)]),
        el('td', { text: '→' }), el('td', {}, [chip(t.out)]), el('td', { cls: 'num', text: fmt(t.qk, 2) }),
        el('td', { cls: 'num', text: fmt(t.ov, 2) }), el('td', { cls: 'num', text: fmt(t.strength, 2) })]);
    });
    var box = clear($('trigrams'));
    box.appendChild(table(['source', '', 'destination', '', 'out', 'qk', 'ov', 'strength'], rows));
    box.appendChild(el('p', { cls: 'small', text: 'Direct path, centred circuits: strength = qk(destination, source) × ov(source, out).' }));
  }).catch(report);
}

// -- two heads ---------------------------------------------------------------------------------
function setPairSelects() {
  ['writer', 'reader'].forEach(function (which) {
    var select = clear($(which));
    model.heads.forEach(function (name) { select.appendChild(el('option', { text: name })); });
    if (state[which]) select.value = state[which];
  });
  $('kind').value = state.kind;
}

// -- the strongest pairs: a page at a time, filtered by layer (a model of many heads has too many to draw) --
var PAIRS_PAGE = 20, pairsOffset = 0, pairsTotal = 0;
function setLayerSelects(n_layers) {
  ['pairs-writer-layer', 'pairs-reader-layer'].forEach(function (id) {
    var select = clear($(id));
    select.appendChild(el('option', { value: '', text: 'any' }));
    for (var layer = 0; layer < n_layers; layer++) select.appendChild(el('option', { value: String(layer), text: String(layer) }));
  });
}
function pagePairs(step) {
  var next = pairsOffset + step * PAIRS_PAGE;
  if (next < 0 || (step > 0 && next >= pairsTotal)) return;
  pairsOffset = next;
  listPairs();
}
function listPairs() {
  var params = { kind: $('pairs-kind').value, offset: pairsOffset, limit: PAIRS_PAGE };
  if ($('pairs-writer-layer').value !== '') params.writer_layer = $('pairs-writer-layer').value;
  if ($('pairs-reader-layer').value !== '') params.reader_layer = $('pairs-reader-layer').value;
  var box = clear($('pairs'));
  api('/api/pairs?' + query(params), 'composition scores of every pair').then(function (body) {
    pairsTotal = body.total;
    var rows = body.pairs.map(function (p, i) {
      var tr = el('tr', { cls: 'clickable' }, [el('td', { cls: 'num', text: String(body.offset + i + 1) }), el('td', { text: p.writer }),
        el('td', { text: p.reader }), el('td', { cls: 'num', text: fmt(p.score) }), el('td', { cls: 'num', text: fmt(p.raw) })]);
      tr.addEventListener('click', function () { $('writer').value = p.writer; $('reader').value = p.reader; $('kind').value = body.kind; showPair(); });
      return tr;
    });
    box.appendChild(table(['rank', 'writer', 'reader', body.kind + '-composition − baseline', 'raw'], rows));
    box.appendChild(el('p', { cls: 'small', text: body.total === 0 ? 'No pair: the reader\'s layer must come after the writer\'s.' :
      'Pairs ' + (body.offset + 1) + '–' + (body.offset + body.pairs.length) + ' of ' + body.total + ', strongest first; random baseline ' + fmt(body.baseline) + '.' }));
  }).catch(report);
}

function showPair() {
  state.writer = $('writer').value; state.reader = $('reader').value; state.kind = $('kind').value;
  saveState();
  var box = clear($('pair'));
  api('/api/pair?' + query({ writer: state.writer, reader: state.reader, kind: state.kind, k: 6 }), 'composition').then(function (body) {
    var rows = ['Q', 'K', 'V'].map(function (kind) {
      var c = body.composition[kind];
      return el('tr', {}, [el('td', { text: kind }), el('td', { cls: 'num', text: fmt(c.raw) }), el('td', { cls: 'num', text: fmt(c.baseline) }),
        el('td', { cls: 'num', text: fmt(c.score) })]);
    });
    box.appendChild(table(['composition', 'raw', 'random baseline', 'raw − baseline'], rows));
    box.appendChild(el('p', { text: 'K-composition induction check: eigenvalue positivity of the token-level circuit W_E W_Q(' + body.reader +
      ') W_K(' + body.reader + ')ᵀ (W_E W_V W_O(' + body.writer + '))ᵀ = ' + fmt(body.k_composition_positivity, 2) +
      ' (near +1: ' + body.reader + '\'s query for a token matches keys of sources whose previous token, moved there by ' + body.writer + ', is the same token: induction).' }));
    box.appendChild(el('h4', { text: 'Virtual weight W_O(' + body.writer + ') W_' + body.kind + '(' + body.reader + '): singular values' }));
    var values = body.virtual_weight.singular_values;
    box.appendChild(el('p', { cls: 'small', text: values.slice(0, 12).map(function (s) { return fmt(s, 2); }).join('  ') +
      (values.length > 12 ? '  … (' + values.length + ' in all)' : '') }));
    var readerSide = { K: 'destination tokens whose queries seek it', Q: 'source tokens whose keys answer it', V: 'logits it then writes' }[body.kind];
    var rows = body.virtual_weight.directions.map(function (d, i) {
      return el('tr', {}, [el('td', { text: (i + 1) + ' (σ ' + fmt(d.singular_value, 2) + ')' }),
        el('td', {}, d.writer.positive.map(chip)), el('td', {}, d.reader.positive.map(chip)),
        el('td', {}, d.writer.negative.map(chip)), el('td', {}, d.reader.negative.map(chip))]);
    });
    box.appendChild(table(['direction', 'writer moves (+)', 'reader: ' + readerSide + ' (+)', 'writer moves (−)', 'reader (−)'], rows));
    box.appendChild(el('p', { cls: 'small', text: 'Writer side: the source tokens ' + body.writer + ' moves along the direction (W_E W_V u). ' +
      'Same-sign ends compose positively.' }));
  }).catch(report);
}

// -- the user's data: its rows, a page at a time ----------------------------------------------------
function loadData() {
  return api('/api/data?' + query({ offset: dataOffset, limit: DATA_PAGE }), 'scoring the data').then(function (body) {
    data = body;
    $('data-summary').textContent = body.description + ': loss ' + fmt(body.loss) + ' nats, accuracy ' + fmt(body.accuracy) +
      ' over ' + body.targeted + ' positions with a target. Click a row to see it below, in place of the typed text.';
    $('data-page').textContent = 'rows ' + body.offset + ' to ' + (body.offset + body.listed.length - 1) + ' of ' + body.rows;
    $('data-previous').disabled = body.offset === 0;
    $('data-next').disabled = body.offset + body.listed.length >= body.rows;
    drawDataRows();
  }).catch(report);
}

function drawDataRows() {
  if (!data) return;
  var rows = data.listed.map(function (r) {
    var tr = el('tr', { cls: 'clickable' + (r.row === state.row ? ' current' : '') }, [el('td', { cls: 'num', text: String(r.row) }),
      el('td', { cls: 'num', text: String(r.length) }), el('td', { cls: 'num', text: String(r.targeted) }),
      el('td', { cls: 'num', text: fmt(r.loss) }), el('td', { cls: 'num', text: fmt(r.accuracy) }),
      el('td', {}, r.tokens.map(chip).concat(r.length > r.tokens.length ? ['…'] : []))]);
    tr.addEventListener('click', function () { runRow(r.row); });
    return tr;
  });
  clear($('data-rows')).appendChild(table(['row', 'length', 'targets', 'loss', 'accuracy', 'first tokens'], rows));
}

function pageData(step) { dataOffset = Math.max(0, dataOffset + step * DATA_PAGE); loadData(); }

// -- MLP neurons: keys and values read off the weights -------------------------------------------
state.nlayer = ''; state.neuron = '';  // before loadState reads the address

function startNeurons() {
  if (!model.config.d_mlp) return;
  $('neuron-section').hidden = false;
  var select = clear($('neuron-layer'));
  for (var l = 0; l < model.config.n_layers; l++) select.appendChild(el('option', { value: String(l), text: 'L' + l }));
  select.value = state.nlayer || '0';
  $('neuron-id').max = String(model.config.d_mlp - 1);
  $('neuron-id').value = state.neuron || '0';
  $('neuron-go').addEventListener('click', function () { showNeuron(select.value, $('neuron-id').value); });
  if (state.neuron !== '') showNeuron(select.value, $('neuron-id').value);
}

function neuronTable(body) {
  var rows = body.excited_by.map(function (t, i) {
    var up = body.raised[i], down = body.lowered[i];
    return el('tr', {}, [el('td', {}, [chip(t)]), el('td', { cls: 'num', text: fmt(t.value, 2) }),
      el('td', {}, [chip(up)]), el('td', { cls: 'num', text: fmt(up.value, 2) }),
      el('td', {}, [chip(down)]), el('td', { cls: 'num', text: fmt(down.value, 2) })]);
  });
  return table(['key: excited by', 'pre-activation', 'value: raises', 'logit', 'value: lowers', 'logit'], rows);
}

function showNeuron(layer, neuron) {
  state.nlayer = String(layer); state.neuron = String(neuron);
  $('neuron-layer').value = state.nlayer; $('neuron-id').value = state.neuron;
  saveState();
  api('/api/neuron?' + query({ layer: layer, neuron: neuron, k: 10 }), 'MLP neuron').then(function (body) {
    var top = clear($('neuron-top'));
    top.appendChild(el('span', { cls: 'small', text: 'largest direct logit effect in L' + body.layer + ': ' }));
    body.top_neurons.forEach(function (n) {
      top.appendChild(el('button', { cls: 'head' + (n.neuron === body.neuron ? ' active' : ''), text: 'N' + n.neuron + ' ' + fmt(n.logit_effect, 2),
        onclick: function () { showNeuron(body.layer, n.neuron); } }));
    });
    var box = clear($('neuron'));
    box.appendChild(el('h3', { text: 'L' + body.layer + 'N' + body.neuron + ': direct logit effect ' + fmt(body.logit_effect) +
      ' (rank ' + body.rank + ' of ' + model.config.d_mlp + ' in its layer)' }));
    box.appendChild(neuronTable(body));
    box.appendChild(el('p', { cls: 'small', text: 'Direct path, LayerNorm folded (if any) at unit scale: key W_E W_in[:, n] ' +
      '(the pre-activation a token\'s embedding alone gives), value W_out[n] W_U (logits per unit of activation).' }));
  }).catch(report);
}

// -- vocabulary search -------------------------------------------------------------------------
var searchTimer = null;
function search() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(function () {
    var prefix = $('vocab-search').value, box = clear($('vocab-results'));
    if (!prefix) return;
    api('/api/vocab?' + query({ prefix: prefix, k: 20 }), 'vocabulary search').then(function (body) {
      body.matches.forEach(function (t) {
        tokenCache[t.id] = t.str;
        box.appendChild(el('button', { text: shown(t.str), title: '#' + t.id, onclick: function () {
          state.token = t.id; saveState(); showToken();
        } }));
      });
      if (!body.matches.length) box.appendChild(el('span', { cls: 'small', text: 'no token starts with that' }));
    }).catch(report);
  }, 200);
}

// ids 1 to 5 twice, as many as the context and the vocabulary allow
function exampleIds(c) {
  var ids = [];
  for (var i = 0; i < Math.min(10, c.n_ctx); i++) ids.push((i % 5 + 1) % c.d_vocab);
  return ids.join(' ');
}

// -- start -------------------------------------------------------------------------------------
async function start() {
  loadState();
  model = await api('/api/model', 'model');
  var c = model.config;
  $('model').textContent = model.name + ': ' + c.n_layers + ' layers × ' + c.n_heads + ' heads, d_model ' + c.d_model +
    ', vocabulary ' + c.d_vocab + (model.d_out !== c.d_vocab ? ', ' + model.d_out + ' output classes' : '') + ', context ' + c.n_ctx;
  if (!state.text) state.text = model.has_tokenizer ? 'def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n' : exampleIds(c);
  $('text').value = state.text;
  document.querySelectorAll('input[name=mode]').forEach(function (r) {
    r.checked = r.value === state.mode;
    r.addEventListener('change', function () { state.mode = r.value; saveState(); if (run) paint(null); });
  });
  $('trigram-role').value = state.role;
  $('run').addEventListener('click', runText);
  $('trigram-go').addEventListener('click', showTrigrams);
  $('pair-go').addEventListener('click', showPair);
  $('pairs-go').addEventListener('click', function () { pairsOffset = 0; listPairs(); });
  $('pairs-previous').addEventListener('click', function () { pagePairs(-1); });
  $('pairs-next').addEventListener('click', function () { pagePairs(1); });
  $('vocab-search').addEventListener('input', search);
  $('data-previous').addEventListener('click', function () { pageData(-1); });
  $('data-next').addEventListener('click', function () { pageData(1); });
  drawHeadButtons();
  setPairSelects();
  setLayerSelects(c.n_layers);
  if (model.data) {
    $('data-section').hidden = false;
    if (state.row !== null) dataOffset = Math.floor(state.row / DATA_PAGE) * DATA_PAGE;
    loadData();
  }
  var first = function () { return state.row !== null && model.data ? runRow(state.row) : runText(); };
  startNeurons();
  if (c.n_layers === 0) return first();
  if (!state.head) state.head = model.heads[0];
  await first();
  selectHead(state.head);
  loadScores();
  if (state.writer && state.reader) showPair();
}
start().catch(report);

// -- circuit: the graph results.json holds; click an edge for its attribution -------------------
var circuitGraph = null;
var EDGE_COLOURS = { Q: '#1f77b4', K: '#d62728', V: '#2ca02c' };
function svgNode(tag, attrs) {
  var node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
  return node;
}
function circuitPositions(nodes) {
  var layers = {}, where = {}, gap = 110, row = 110, margin = 50;
  nodes.forEach(function (n) { (layers[n.layer] = layers[n.layer] || []).push(n); });
  var count = Object.keys(layers).length, widest = Math.max.apply(null, Object.values(layers).map(function (l) { return l.length; }));
  Object.keys(layers).forEach(function (layer) {
    layers[layer].forEach(function (n, i) { where[n.head] = [margin + gap * (i + 0.5), margin + row * (count - 1 - layer) + 20]; });
  });
  return { where: where, width: 2 * margin + gap * widest, height: 2 * margin + row * (count - 1) + 40 };
}
function drawCircuit() {
  var box = clear($('circuit')), g = circuitGraph;
  var layout = circuitPositions(g.nodes), offsets = { Q: -10, K: 0, V: 10 };
  var svg = svgNode('svg', { width: layout.width, height: layout.height, 'aria-label': 'circuit graph' });
  g.edges.forEach(function (e, i) {
    var a = layout.where[e.writer], b = layout.where[e.reader];
    var ends = { x1: a[0], y1: a[1] - 14, x2: b[0] + offsets[e.kind], y2: b[1] + 34 };  // below the roles
    var line = svgNode('line', Object.assign({ stroke: EDGE_COLOURS[e.kind], 'stroke-width': 1 + 5 * Math.min(Math.abs(e.weight), 1),
      'stroke-opacity': 0.75 }, ends));
    if (e.weight < 0) line.setAttribute('stroke-dasharray', '5 3');
    var hit = svgNode('line', Object.assign({ stroke: '#000', 'stroke-opacity': 0, 'stroke-width': 12, 'pointer-events': 'stroke',
      'class': 'circuit-edge', 'data-edge': i }, ends));
    var tip = svgNode('title', {}); tip.textContent = e.writer + ' → ' + e.reader + ' ' + e.kind + ' ' + fmt(e.weight, 2);
    hit.appendChild(tip);
    hit.addEventListener('click', function () { showEdge(i); });
    svg.appendChild(line); svg.appendChild(hit);
  });
  g.nodes.forEach(function (n) {
    var p = layout.where[n.head];
    svg.appendChild(svgNode('circle', { cx: p[0], cy: p[1], r: 14, fill: '#f4f4f4', stroke: '#333' }));
    var name = svgNode('text', { x: p[0], y: p[1] + 4, 'text-anchor': 'middle' }); name.textContent = n.head;
    var roles = svgNode('text', { x: p[0], y: p[1] + 28, 'text-anchor': 'middle', fill: '#555' });
    roles.textContent = n.roles.map(function (r) { return r.replace(/_/g, ' '); }).join(', ');
    svg.appendChild(name); svg.appendChild(roles);
  });
  box.appendChild(svg);
  box.appendChild(el('p', { cls: 'small', text: g.edges.length + ' edges with |weight| ≥ ' + g.threshold + ', measured on ' + g.tokens + '.' }));
}
function showEdge(i) {
  var e = circuitGraph.edges[i], box = clear($('circuit-edge'));
  box.appendChild(el('h3', { text: e.writer + ' → ' + e.reader + ' (' + e.kind + '-composition): ' + fmt(e.weight, 3) }));
  box.appendChild(el('p', {}, ['ACDC name: ', el('code', { text: e.name })]));
  var rows = Object.keys(e.parts).map(function (p) {
    return el('tr', {}, [el('td', { text: p }), el('td', { cls: 'num', text: fmt(e.parts[p], 4) })]);
  });
  box.appendChild(table(['writer part', 'share of ' + e.reader + "'s " + (e.kind === 'V' ? 'write' : e.kind === 'Q' ? 'score variation (query side)' : 'score variation (key side)')], rows));
}
function showCircuit() {
  showError('');
  return api('/api/circuit', 'reading the circuit').then(function (body) { circuitGraph = body; drawCircuit(); }).catch(report);
}
$('circuit-go').addEventListener('click', showCircuit);
