package xds

import (
	"fmt"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flashgate/flashgate/rls"
)

// TypeURL is the xDS type of ratelimit's config resources.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// maxNameLen bounds a resource's name as errors and logs quote it.
const maxNameLen = 128

// The YAML a resource becomes: ratelimit's file schema, only the fields the
// proto has.
type (
	yamlFile struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value,omitempty"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
		ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	}
	yamlRateLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// Files converts a response's resources to the config files rls.ParseFiles
// reads, each named "xds:" and the resource's name. A resource of another
// type, one that does not decode, or more than rls.MaxFiles is an error.
func Files(resources []*anypb.Any) ([]rls.File, error) {
	if len(resources) > rls.MaxFiles {
		return nil, fmt.Errorf("%d resources: more than %d", len(resources), rls.MaxFiles)
	}
	files := make([]rls.File, 0, len(resources))
	for i, res := range resources {
		if res.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d: type %.*q, want %s", i, maxNameLen, res.GetTypeUrl(), TypeURL)
		}
		var conf rlsconfv3.RateLimitConfig
		if err := anypb.UnmarshalTo(res, &conf, proto.UnmarshalOptions{}); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		name := conf.GetName()
		if name == "" {
			name = fmt.Sprintf("resource-%d", i)
		}
		if len(name) > maxNameLen {
			name = name[:maxNameLen]
		}
		data, err := yaml.Marshal(yamlFile{Domain: conf.GetDomain(), Descriptors: descriptors(conf.GetDescriptors())})
		if err != nil {
			return nil, fmt.Errorf("resource %q: %w", name, err)
		}
		files = append(files, rls.File{Name: "xds:" + name, Data: data})
	}
	return files, nil
}

func descriptors(ds []*rlsconfv3.RateLimitDescriptor) []yamlDescriptor {
	if len(ds) == 0 {
		return nil
	}
	out := make([]yamlDescriptor, len(ds))
	for i, d := range ds {
		out[i] = yamlDescriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      policy(d.GetRateLimit()),
			Descriptors:    descriptors(d.GetDescriptors()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
		}
	}
	return out
}

// policy converts a rate limit as ratelimit does; an unlimited limit's
// proto zero values stand for fields left out.
func policy(p *rlsconfv3.RateLimitPolicy) *yamlRateLimit {
	if p == nil {
		return nil
	}
	y := &yamlRateLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
	if u := p.GetUnit(); u != rlsconfv3.RateLimitUnit_UNKNOWN || !y.Unlimited {
		y.Unit = u.String()
	}
	if n := p.GetRequestsPerUnit(); n != 0 || !y.Unlimited {
		y.RequestsPerUnit = &n
	}
	for _, r := range p.GetReplaces() {
		y.Replaces = append(y.Replaces, yamlReplace{Name: r.GetName()})
	}
	return y
}
