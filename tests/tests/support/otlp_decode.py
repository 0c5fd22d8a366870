"""Decodes OTLP profiles export requests (the files named on the command line) with the
official generated classes (the opentelemetry-proto package) and prints, as JSON, what
tests/tests/agent_otlp.rs checks: per request, the dictionary's zero entries, and per
resource its attributes and its samples with their frames, mappings and build ids."""
import json
import sys

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def main():
    out = []
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            req = ExportProfilesServiceRequest.FromString(f.read())
        d = req.dictionary
        s = d.string_table
        zero = {
            "string": s[0] == "",
            "mapping": d.mapping_table[0].ByteSize() == 0,
            "location": d.location_table[0].ByteSize() == 0,
            "function": d.function_table[0].ByteSize() == 0,
            "link": d.link_table[0].ByteSize() == 0,
            "attribute": d.attribute_table[0].ByteSize() == 0,
            "stack": d.stack_table[0].ByteSize() == 0,
        }

        def attrs(indices):
            return {s[d.attribute_table[i].key_strindex]: any_value(d.attribute_table[i].value) for i in indices}

        resources = []
        for rp in req.resource_profiles:
            res = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
            samples = []
            for sp in rp.scope_profiles:
                for p in sp.profiles:
                    prof = {
                        "scope": sp.scope.name,
                        "sample_type": [s[p.sample_type.type_strindex], s[p.sample_type.unit_strindex]],
                        "period_type": [s[p.period_type.type_strindex], s[p.period_type.unit_strindex]],
                        "period": p.period,
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                    }
                    for sample in p.samples:
                        frames = []
                        for li in d.stack_table[sample.stack_index].location_indices:
                            loc = d.location_table[li]
                            m = d.mapping_table[loc.mapping_index]
                            frames.append({
                                "name": s[d.function_table[loc.lines[0].function_index].name_strindex] if loc.lines else "",
                                "address": loc.address,
                                "mapping": s[m.filename_strindex],
                                "mapping_attrs": attrs(m.attribute_indices),
                            })
                        samples.append({
                            "profile": prof,
                            "frames": frames,
                            "attrs": attrs(sample.attribute_indices),
                            "timestamps": list(sample.timestamps_unix_nano),
                            "values": list(sample.values),
                        })
            resources.append({"attributes": res, "samples": samples})
        out.append({"zero": zero, "resources": resources})
    json.dump(out, sys.stdout)


main()
