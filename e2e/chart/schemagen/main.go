// Command schemagen writes kubeconform schemas, offline, from the Kubernetes OpenAPI v2 document
// (api/openapi-spec/swagger.json of the k8s.io/kubernetes module) and from CRD manifests. It does
// what yannh/openapi2jsonschema does with --kubernetes --strict --stand-alone, without the network:
//
//	schemagen -swagger swagger.json -out DIR [crd.yaml ...]
//
// Layout: DIR/<group, or v1 for the core group>/<kind>_<version>.json, i.e. the kubeconform
// -schema-location template "DIR/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json".
// Every schema is strict (additionalProperties: false wherever properties are listed) and
// self-contained (the definitions it references are copied in).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

type schema = map[string]any

func main() {
	swagger := flag.String("swagger", "", "Kubernetes swagger.json")
	out := flag.String("out", "", "output directory")
	flag.Parse()
	if *swagger == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: schemagen -swagger swagger.json -out DIR [crd.yaml ...]")
		os.Exit(2)
	}
	n, err := fromSwagger(*swagger, *out)
	check(err, "reading "+*swagger)
	for _, path := range flag.Args() {
		m, err := fromCRDs(path, *out)
		check(err, "reading "+path)
		n += m
	}
	fmt.Fprintf(os.Stderr, "schemagen: %d schemas in %s\n", n, *out)
}

func check(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "schemagen: %s: %v\n", what, err)
		os.Exit(1)
	}
}

// fromSwagger writes one schema per group/version/kind the document declares.
func fromSwagger(path, out string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var doc struct {
		Definitions map[string]schema `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return 0, err
	}
	defs := map[string]any{}
	for name, def := range doc.Definitions {
		defs[name] = kubernetesTypes(name, def)
	}
	n := 0
	for name, def := range doc.Definitions {
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			root := strict(deepCopy(defs[name])).(schema)
			used := map[string]any{}
			collectRefs(root, defs, used)
			for k, v := range used {
				used[k] = strict(deepCopy(v))
			}
			if len(used) > 0 {
				root["definitions"] = used
			}
			if err := write(out, group, version, kind, root); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// kubernetesTypes lets YAML spell the types the API server accepts: IntOrString as either, a
// Quantity as a string or a number.
func kubernetesTypes(name string, def schema) schema {
	if name == "io.k8s.apimachinery.pkg.api.resource.Quantity" {
		return schema{"description": def["description"],
			"oneOf": []any{schema{"type": "string"}, schema{"type": "number"}}}
	}
	return walk(def, func(s schema) schema {
		if s["format"] == "int-or-string" || s["x-kubernetes-int-or-string"] == true {
			return schema{"description": s["description"],
				"oneOf": []any{schema{"type": "string"}, schema{"type": "integer"}}}
		}
		return s
	}).(schema)
}

// collectRefs adds every definition reachable from node to used.
func collectRefs(node any, defs map[string]any, used map[string]any) {
	switch v := node.(type) {
	case schema:
		if ref, ok := v["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, "#/definitions/")
			if _, seen := used[name]; !seen {
				def, ok := defs[name]
				if !ok {
					fmt.Fprintf(os.Stderr, "schemagen: unresolved $ref %s\n", ref)
					os.Exit(1)
				}
				used[name] = def
				collectRefs(def, defs, used)
			}
		}
		for _, child := range v {
			collectRefs(child, defs, used)
		}
	case []any:
		for _, child := range v {
			collectRefs(child, defs, used)
		}
	}
}

// strict forbids fields a schema does not list (a typo in a manifest is then an error), except
// where the schema says unknown fields are kept; optional fields may be null, as in YAML.
func strict(node any) any {
	return walk(node, func(s schema) schema {
		props, hasProps := s["properties"].(schema)
		if hasProps && s["x-kubernetes-preserve-unknown-fields"] != true {
			if _, set := s["additionalProperties"]; !set {
				s["additionalProperties"] = false
			}
		}
		if hasProps {
			required := map[string]bool{}
			if req, ok := s["required"].([]any); ok {
				for _, r := range req {
					if name, ok := r.(string); ok {
						required[name] = true
					}
				}
			}
			for name, p := range props {
				ps, ok := p.(schema)
				if t, isString := ps["type"].(string); ok && isString && !required[name] {
					ps["type"] = []any{t, "null"}
				}
			}
		}
		if s["nullable"] == true {
			if t, ok := s["type"].(string); ok {
				s["type"] = []any{t, "null"}
			}
		}
		return s
	})
}

// walk applies f to every schema object below node, children first.
func walk(node any, f func(schema) schema) any {
	switch v := node.(type) {
	case schema:
		for k, child := range v {
			// Enum and default values are data, not schemas.
			if k == "enum" || k == "default" || k == "example" {
				continue
			}
			v[k] = walk(child, f)
		}
		return f(v)
	case []any:
		for i, child := range v {
			v[i] = walk(child, f)
		}
		return v
	}
	return node
}

func deepCopy(v any) any {
	raw, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(raw, &out)
	return out
}

// fromCRDs writes one schema per served version of each CustomResourceDefinition in the file.
func fromCRDs(path, out string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var crd struct {
			Kind string `json:"kind"`
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Kind string `json:"kind"`
				} `json:"names"`
				Versions []struct {
					Name   string `json:"name"`
					Served bool   `json:"served"`
					Schema struct {
						OpenAPIV3Schema schema `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(doc, &crd); err != nil {
			return n, err
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			root := v.Schema.OpenAPIV3Schema
			if !v.Served || root == nil {
				continue
			}
			// The API server adds these to every custom resource.
			props, _ := root["properties"].(schema)
			if props == nil {
				props = schema{}
				root["properties"] = props
			}
			for _, f := range []string{"apiVersion", "kind"} {
				if _, ok := props[f]; !ok {
					props[f] = schema{"type": "string"}
				}
			}
			if _, ok := props["metadata"]; !ok {
				props["metadata"] = schema{"type": "object"}
			}
			root = strict(kubernetesTypes("", root)).(schema)
			if err := write(out, crd.Spec.Group, v.Name, crd.Spec.Names.Kind, root); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

func write(out, group, version, kind string, s schema) error {
	dir := group
	if dir == "" {
		dir = version // kubeconform's {{ .Group }} of apiVersion "v1"
	}
	s["$schema"] = "http://json-schema.org/schema#"
	path := filepath.Join(out, dir, strings.ToLower(kind)+"_"+version+".json")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(io.Writer(f))
	return enc.Encode(s)
}
