-- Argo CD health check for every trtforge.io kind, TRTEngine and InferenceDeployment (Lua 5.1, as
-- Argo CD runs it; the folder `_` is Argo CD's wildcard kind). Both kinds' status is kstatus-style:
-- nothing is Healthy before the operator has observed the current generation; Stalled or Degraded is
-- Degraded; Ready is Healthy; anything else (a TRTEngine Building, an InferenceDeployment
-- Progressing) is Progressing. A condition computed for an older generation (its own
-- observedGeneration) is ignored. An InferenceDeployment's message ends with the pods ready, there now
-- (current) and wanted (desired: spec.replicas, or what the autoscalers set), as the status has them.
local hs = { status = "Progressing", message = "Waiting for the trtforge operator" }
if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if observed == nil or (generation ~= nil and observed ~= generation) then
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
local conditions = {}
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type ~= nil and (c.observedGeneration == nil or generation == nil or c.observedGeneration == generation) then
      conditions[c.type] = c
    end
  end
end
local function describe(c)
  if c.message ~= nil and c.message ~= "" then
    if c.reason ~= nil and c.reason ~= "" then
      return c.reason .. ": " .. c.message
    end
    return c.message
  end
  if c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return c.type
end
local function replicas_text()
  local s = obj.status
  if s.desiredReplicas == nil then
    return ""
  end
  return " (replicas: " .. tostring(s.readyReplicas or 0) .. " ready, " .. tostring(s.replicas or 0)
    .. " current, " .. tostring(s.desiredReplicas) .. " desired)"
end
local function is_true(name)
  local c = conditions[name]
  return c ~= nil and c.status == "True"
end
if is_true("Stalled") then
  return { status = "Degraded", message = describe(conditions["Stalled"]) .. replicas_text() }
end
if is_true("Degraded") then
  return { status = "Degraded", message = describe(conditions["Degraded"]) .. replicas_text() }
end
if is_true("Ready") then
  return { status = "Healthy", message = describe(conditions["Ready"]) .. replicas_text() }
end
for _, name in ipairs({ "Progressing", "Building" }) do
  if is_true(name) then
    return { status = "Progressing", message = describe(conditions[name]) .. replicas_text() }
  end
end
if conditions["Ready"] ~= nil then
  hs.message = describe(conditions["Ready"])
end
hs.message = hs.message .. replicas_text()
return hs
