#!/usr/bin/env python3
"""Checks the Kubernetes manifests of deploy/kubernetes (test_deploy_manifests).

usage: check_manifests.py DIR INFERGATE_BINARY

Parses every YAML file (python3-yaml), then checks what `kubectl apply`
and a working deployment depend on: kinds and API versions, names and
namespaces, selectors that match their pods, probes on the right paths and
named ports, resources (GPU or MIG for workers), the gateway's shutdown
timing against its config, headless Services whose DNS names the gateway's
pools[].discover follow, KEDA ScaledObjects aimed at the worker
Deployments with a Prometheus query over our metrics, and that every
region config passes `infergate serve --check-config`. Prints one line per
problem; exit status 1 when there is any.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

API = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "Deployment": "apps/v1",
    "ScaledObject": "keda.sh/v1alpha1",
    "PodDisruptionBudget": "policy/v1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
}
NAMESPACE = "infergate"
problems = []


def bad(where, msg):
    problems.append(f"{where}: {msg}")


def load_dir(d):
    docs = []
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if not name.endswith(".yaml") or name == "kustomization.yaml":
            continue
        with open(path) as f:
            for i, doc in enumerate(yaml.safe_load_all(f)):
                if doc is not None:
                    docs.append((f"{name}#{i}", doc))
    return docs


def check_config(where, text, exe):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([exe, "serve", "--config", path, "--check-config"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            bad(where, "the region config fails --check-config: " + r.stderr.strip())
            return None
        return json.loads(text)
    finally:
        os.unlink(path)


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def service_of(dns):
    """A discovered name as (the Service's DNS name, port name, protocol):
    an SRV name _PORT._PROTO.SERVICE gives its parts, a plain name itself."""
    parts = dns.split(".", 2)
    if len(parts) == 3 and parts[0].startswith("_") and parts[1].startswith("_"):
        return parts[2], parts[0][1:], parts[1][1:]
    return dns, None, None


def port_names(container):
    return {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}


def check_probe(where, c, kind, path):
    probe = c.get(kind)
    if not probe or "httpGet" not in probe:
        bad(where, f"{kind}: missing (want httpGet {path})")
        return
    g = probe["httpGet"]
    if g.get("path") != path:
        bad(where, f"{kind}: path {g.get('path')!r}, want {path!r}")
    port = g.get("port")
    if isinstance(port, str) and port not in port_names(c):
        bad(where, f"{kind}: port {port!r} names no container port")


def check_resources(where, c, want_accel):
    res = c.get("resources", {})
    req, lim = res.get("requests", {}), res.get("limits", {})
    for k in ("cpu", "memory"):
        if k not in req:
            bad(where, f"resources.requests.{k}: missing")
    accel = [k for k in set(req) | set(lim)
             if k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-")]
    if want_accel and not accel:
        bad(where, "resources: no nvidia.com/gpu or nvidia.com/mig-* for a worker")
    for k in accel:
        # Extended resources cannot be overcommitted: requests == limits.
        if req.get(k) != lim.get(k):
            bad(where, f"resources: {k} requests {req.get(k)} != limits {lim.get(k)}")
        if k.startswith("nvidia.com/mig-") and not re.fullmatch(r"nvidia\.com/mig-\d+g\.\d+gb", k):
            bad(where, f"resources: {k} is not a MIG profile name (nvidia.com/mig-1g.18gb)")


def main(d, exe):
    docs = load_dir(d)
    by_kind = {}
    for where, o in docs:
        kind = o.get("kind")
        if kind not in API:
            bad(where, f"kind {kind!r} is not one of {sorted(API)}")
            continue
        if o.get("apiVersion") != API[kind]:
            bad(where, f"apiVersion {o.get('apiVersion')!r}, want {API[kind]!r}")
        meta = o.get("metadata", {})
        if not meta.get("name"):
            bad(where, "metadata.name: missing")
        if kind != "Namespace" and meta.get("namespace") != NAMESPACE:
            bad(where, f"metadata.namespace {meta.get('namespace')!r}, want {NAMESPACE!r}")
        by_kind.setdefault(kind, []).append((where, o))

    for kind in API:
        if kind not in by_kind:
            bad(d, f"no {kind}")

    configs = {o["metadata"]["name"]: (w, o) for w, o in by_kind.get("ConfigMap", [])}
    region = None
    for name, (w, o) in configs.items():
        text = o.get("data", {}).get("region.json")
        if text is None:
            bad(w, "data.region.json: missing")
        else:
            region = check_config(w, text, exe)

    deployments = by_kind.get("Deployment", [])
    services = by_kind.get("Service", [])
    gateways = [(w, o) for w, o in deployments
                if o["spec"]["template"]["metadata"]["labels"].get(
                    "app.kubernetes.io/component") == "gateway"]
    workers = [(w, o) for w, o in deployments if (w, o) not in gateways]
    if len(gateways) != 1:
        bad(d, f"{len(gateways)} gateway Deployments, want 1")
    if not workers:
        bad(d, "no worker Deployment")

    for w, o in deployments:
        spec = o["spec"]
        pod = spec["template"]
        if not labels_match(spec.get("selector", {}).get("matchLabels"), pod["metadata"]["labels"]):
            bad(w, "spec.selector.matchLabels does not match the pod template's labels")
        for c in pod["spec"]["containers"]:
            if not c.get("image"):
                bad(w, f"container {c.get('name')}: no image")
            check_probe(w, c, "readinessProbe", "/ready")
            check_probe(w, c, "livenessProbe", "/health")
            check_resources(w, c, (w, o) in workers)

    for w, o in gateways:
        pod = o["spec"]["template"]["spec"]
        c = pod["containers"][0]
        stop = c.get("lifecycle", {}).get("preStop", {})
        sleep_s = stop.get("sleep", {}).get("seconds")
        if sleep_s is None:
            bad(w, "lifecycle.preStop.sleep.seconds: missing (the drain grace before SIGTERM)")
            sleep_s = 0
        if region is not None:
            lim = region.get("limits", {})
            need = sleep_s + (lim.get("drain_grace_ms", 5000) + lim.get("drain_timeout_ms", 30000)) / 1000
            grace = pod.get("terminationGracePeriodSeconds", 30)
            if grace <= need:
                bad(w, f"terminationGracePeriodSeconds {grace} does not cover preStop {sleep_s} s "
                       f"+ drain grace + drain timeout ({need:g} s)")
        args = c.get("args", [])
        cfg = args[args.index("--config") + 1] if "--config" in args else None
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        ok = False
        for vname, mpath in mounts.items():
            cm = vols.get(vname, {}).get("configMap", {}).get("name")
            if cm in configs and cfg == os.path.join(mpath, "region.json"):
                ok = True
        if not ok:
            bad(w, f"--config {cfg!r} is not region.json of a mounted ConfigMap")
        if not any(s["spec"].get("clusterIP") != "None" and
                   labels_match(s["spec"].get("selector"), o["spec"]["template"]["metadata"]["labels"])
                   for _, s in services):
            bad(w, "no Service selects the gateway pods")

    # Workers: a headless Service each, named by a discovered pool's DNS.
    discovered = {}
    for p in (region or {}).get("pools", []):
        if "discover" in p:
            discovered[p["discover"]["dns"]] = p
    for w, o in workers:
        labels = o["spec"]["template"]["metadata"]["labels"]
        c = o["spec"]["template"]["spec"]["containers"][0]
        listen = [a.split("=", 1)[1] for a in c.get("args", []) if a.startswith("--listen=")]
        lport = int(listen[0].rsplit(":", 1)[1]) if listen else None
        heads = [(sw, s) for sw, s in services
                 if s["spec"].get("clusterIP") == "None" and labels_match(s["spec"].get("selector"), labels)]
        if len(heads) != 1:
            bad(w, f"{len(heads)} headless Services select these pods, want 1")
            continue
        sw, s = heads[0]
        if s["spec"].get("publishNotReadyAddresses"):
            bad(sw, "publishNotReadyAddresses: pods would be in DNS before /ready")
        sport = s["spec"]["ports"][0]
        target = sport.get("targetPort")
        tport = port_names(c).get(target) if isinstance(target, str) else target
        if tport != lport:
            bad(sw, f"targetPort {target!r} is not the worker's --listen port {lport}")
        dns = f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local"
        pool = discovered.get(dns)
        srv = [n for n in discovered if service_of(n)[0] == dns]
        if region is not None and pool is None and not srv:
            bad(sw, f"no pool of the region config discovers {dns}")
        elif pool is not None and pool["discover"].get("port") != sport["port"]:
            bad(sw, f"pool {pool['name']} discovers port {pool['discover'].get('port')}, "
                    f"the Service has {sport['port']}")
        for n in srv:
            _, pname, proto = service_of(n)
            if proto != "tcp" or pname not in [q.get("name") for q in s["spec"]["ports"]]:
                bad(sw, f"{n}: the Service has no TCP port named {pname!r}")
            elif "port" in discovered[n]["discover"]:
                bad(sw, f"{n} is an SRV name: the records carry the port, the pool names none")
    for dns in discovered:
        if not any(f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc.cluster.local"
                   == service_of(dns)[0] for _, s in services):
            bad(d, f"the region config discovers {dns}, which no Service here names")

    names = {o["metadata"]["name"] for _, o in workers}
    scaled = set()
    for w, o in by_kind.get("ScaledObject", []):
        ref = o["spec"].get("scaleTargetRef", {}).get("name")
        if ref not in names:
            bad(w, f"scaleTargetRef {ref!r} is not a worker Deployment")
        scaled.add(ref)
        lo, hi = o["spec"].get("minReplicaCount", 0), o["spec"].get("maxReplicaCount", 100)
        if not 0 <= lo <= hi:
            bad(w, f"minReplicaCount {lo} / maxReplicaCount {hi}")
        for t in o["spec"].get("triggers", []):
            m = t.get("metadata", {})
            if t.get("type") != "prometheus":
                bad(w, f"trigger type {t.get('type')!r}, want prometheus")
            if "infergate_worker_requests_waiting" not in m.get("query", ""):
                bad(w, "the query does not read infergate_worker_requests_waiting (queue depth)")
            try:
                float(m.get("threshold"))
            except (TypeError, ValueError):
                bad(w, f"threshold {m.get('threshold')!r} is not a number")
            if not str(m.get("serverAddress", "")).startswith("http"):
                bad(w, "serverAddress: not a URL")
    for n in names - scaled:
        bad(d, f"worker Deployment {n} has no ScaledObject")

    # The gateway: at least 3 replicas, a PodDisruptionBudget that keeps
    # most of them through a drain, and an HPA on its own CPU.
    for w, g in gateways:
        gname, glabels = g["metadata"]["name"], g["spec"]["template"]["metadata"]["labels"]
        replicas = g["spec"].get("replicas", 1)
        if replicas < 3:
            bad(w, f"replicas {replicas}, want at least 3")
        pdbs = [(pw, p) for pw, p in by_kind.get("PodDisruptionBudget", [])
                if labels_match(p["spec"].get("selector", {}).get("matchLabels"), glabels)]
        if len(pdbs) != 1:
            bad(w, f"{len(pdbs)} PodDisruptionBudgets select the gateway pods, want 1")
        for pw, p in pdbs:
            lo = p["spec"].get("minAvailable")
            if not isinstance(lo, int) or not 1 <= lo < replicas:
                bad(pw, f"minAvailable {lo!r}: want 1 <= it < the gateway's {replicas} replicas")
        hpas = [(hw, h) for hw, h in by_kind.get("HorizontalPodAutoscaler", [])
                if h["spec"].get("scaleTargetRef", {}).get("name") == gname]
        if len(hpas) != 1:
            bad(w, f"{len(hpas)} HorizontalPodAutoscalers target {gname}, want 1")
        for hw, h in hpas:
            sp = h["spec"]
            if sp.get("scaleTargetRef", {}).get("kind") != "Deployment":
                bad(hw, "scaleTargetRef.kind: want Deployment")
            if not 3 <= sp.get("minReplicas", 1) <= sp.get("maxReplicas", 0):
                bad(hw, f"minReplicas {sp.get('minReplicas')} / maxReplicas {sp.get('maxReplicas')}")
            cpu = [m for m in sp.get("metrics", []) if m.get("type") == "Resource"
                   and m.get("resource", {}).get("name") == "cpu"]
            if not cpu:
                bad(hw, "no metric on the gateway's CPU")

    check_kustomizations(d, exe)


def check_kustomizations(d, exe):
    regions = {}
    for root, _, files in os.walk(d):
        if "kustomization.yaml" not in files:
            continue
        kpath = os.path.join(root, "kustomization.yaml")
        with open(kpath) as f:
            k = yaml.safe_load(f)
        for r in k.get("resources", []):
            if not os.path.exists(os.path.join(root, r)):
                bad(kpath, f"resource {r} does not exist")
        if root == d:
            listed = set(k.get("resources", []))
            for name in os.listdir(d):
                if name.endswith(".yaml") and name != "kustomization.yaml" and name not in listed:
                    bad(kpath, f"{name} is not listed in resources")
        for g in k.get("configMapGenerator", []):
            for fname in g.get("files", []):
                p = os.path.join(root, fname)
                if not os.path.exists(p):
                    bad(kpath, f"configMapGenerator file {fname} does not exist")
                    continue
                with open(p) as f:
                    cfg = check_config(p, f.read(), exe)
                if cfg is not None:
                    regions[cfg["region"]] = cfg
    # The two-region example: each region names the other as a site.
    if len(regions) >= 2:
        for name, cfg in regions.items():
            peers = {s.get("region") for s in cfg.get("sites", [])}
            if not (set(regions) - {name}) <= peers:
                bad(d, f"region {name} has no site for {sorted(set(regions) - {name} - peers)}")
    elif os.path.isdir(os.path.join(d, "two-region")):
        bad(d, "two-region/: fewer than two region configs")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
    for p in problems:
        print(p)
    print(f"{len(problems)} problems", file=sys.stderr)
    sys.exit(1 if problems else 0)
